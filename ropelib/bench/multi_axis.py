"""Multi-axis RoPE measured: ropelib's kernel against a copy of q and k, transformers' own code
and torch.compile of it; and ropelib's drop-in for transformers 4.x on materialised bf16 tables
against Liger Kernel's kernel on the same tables.

Three cases, bf16, q and k together at least 256 MiB (`CASES`; `TINY`: stand-ins for the
interpreter):

* mrope: Qwen2-VL-7B's text attention, q [4, 8192, 28, 128], k [4, 8192, 4, 128] (bshd),
  mrope_section [16, 24, 24], positions [3, 4, 8192] (text, then an image grid, per batch);
* axial2d: Qwen2-VL's vision encoder, 2-D (row, column) RoPE over 65536 packed patches (thd),
  q and k [65536, 16, 80];
* axial3d: a video of 16 x 32 x 32 patches (bshd, batch 1, 32 heads, head dim 128), 3-D
  (time, row, column) axial RoPE with sections [22, 21, 21] pairs.

`measure_case` (providers ropelib, copy, hf_eager, hf_compile) and `measure_tables_case`
(providers ropelib = `ropelib.hf.apply_multimodal_rotary_pos_emb`, liger =
`LigerQwen2VLMRopeFunction`, pytorch = transformers 4.x's formula eagerly, torch.compile = that
formula compiled, copy) return one row per (provider, pass): "fwd" and "fwd+bwd" (gradients of q
and k). Each provider's outputs (and gradients) are checked against an fp64 reference before it
is timed (`max_err`: max |got - ref| / (1 + |ref|), at most `TOL`); a provider that fails or
differs has available=False and the reason. Timings (`timed=True`) go through
`ropelib.bench.compare.time_ms`: do_bench medians in ms on a GPU, meaningless wall clock in the
interpreter. `fraction_of_copy` = copy ms / provider ms of the same pass, same run; the copy
provider is checked as clones of q and k and timed as device copies of them
(`compare.copy_floor`), twice for forward+backward: a clone's backward hands the gradient
through without copying it.
"""
import torch

import ropelib
from .. import mrope, runtime
from ..reference import rotate_half
from . import compare

COPY_NOTE = "device copies of q and k (two for forward+backward)"
# case -> (layout, B, S, HQ, HK, D, section, style, base); TINY: (B, S, HQ, HK, D, section)
CASES = {
    "mrope": ("bshd", 4, 8192, 28, 4, 128, [16, 24, 24], "mrope", 1e6),
    "axial2d": ("thd", 1, 65536, 16, 16, 80, [20, 20], "axial", 1e4),
    "axial3d": ("bshd", 1, 16 * 32 * 32, 32, 32, 128, [22, 21, 21], "axial", 1e4),
}
TINY = {"mrope": (2, 12, 4, 2, 16, [2, 3, 3]), "axial2d": (1, 24, 2, 2, 16, [4, 4]),
        "axial3d": (1, 18, 2, 2, 24, [4, 4, 4])}
# max |got - ref| / (1 + |ref|): bf16 outputs are within a few ulps (2**-8 relative each);
# transformers rounds cos/sin and each product to bf16
TOL = 2**-5
PASSES = ("fwd", "fwd+bwd")


def positions_for(case, B, S, device):
    """Positions [axes, B, S] (thd: [axes, S]) as the models build them."""
    if case == "mrope":     # text, an image grid, text again (Qwen2-VL's get_rope_index pattern)
        n_text = S // 4
        side = int((S - 2 * n_text) ** 0.5)
        image = mrope.grid_positions(1, side, side, start=n_text)
        rest = S - n_text - image.shape[1]
        after = torch.arange(rest) + int(image.max()) + 1
        pos = torch.cat([torch.arange(n_text).expand(3, n_text), image, after.expand(3, rest)], 1)
        return torch.stack([pos + b for b in range(B)], 1).to(device)
    if case == "axial2d":   # one square image of S patches (or a strip in the tiny case)
        side = int(S ** 0.5)
        h, w = (side, S // side) if side * (S // side) == S else (1, S)
        return mrope.grid_positions(1, h, w, axes=2).to(device)
    t = 16 if S == 16 * 32 * 32 else 2
    hw = S // t
    h = int(hw ** 0.5)
    return mrope.grid_positions(t, h, hw // h).to(device)[:, None].expand(3, B, S)


def gathered_cos_sin(positions, freqs, dtype):
    """Plain PyTorch: cos/sin [B', S, R] (or [S, R] for 2-D positions) in `dtype`."""
    inv, axis, _ = freqs
    ang = positions[..., None].to(dtype) * inv.to(dtype)                # [A, ..., R/2]
    idx = axis.long().view(*([1] * positions.dim()), -1).expand(1, *ang.shape[1:])
    theta = ang.gather(0, idx)[0]
    emb = torch.cat((theta, theta), -1)
    return emb.cos(), emb.sin()


def torch_mrope(q, k, positions, freqs):
    """Plain PyTorch multi-axis RoPE in fp32 with one rounding (q, k in bshd or thd)."""
    cos, sin = gathered_cos_sin(positions, freqs, torch.float32)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)                     # broadcast over heads
    return tuple((x.float() * cos + rotate_half(x.float()) * sin).to(x.dtype) for x in (q, k))


def hf_function(case, D, section, base, freqs, device):
    """transformers' implementation of the case, as a function of (q, k, positions), or the
    plain PyTorch one (axial3d), and a note saying which."""
    if case == "mrope":
        from transformers.models.qwen2_vl import modeling_qwen2_vl as m
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
        cfg = Qwen2VLTextConfig(hidden_size=D * 4, num_attention_heads=4, rope_parameters=dict(
            rope_type="default", rope_theta=base, mrope_section=section))
        rotary = m.Qwen2VLRotaryEmbedding(cfg).to(device)

        def fn(q, k, positions):    # q, k [B, S, H, D]: transformers works on [B, H, S, D]
            cos, sin = rotary(q, positions)
            qe, ke = m.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            return qe.transpose(1, 2), ke.transpose(1, 2)
        return fn, "transformers Qwen2VLRotaryEmbedding + apply_rotary_pos_emb"
    if case == "axial2d":
        from transformers.models.qwen2_vl import modeling_qwen2_vl as m
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
        rotary = m.Qwen2VLVisionRotaryEmbedding(
            Qwen2VLVisionConfig(embed_dim=D * 4, num_heads=4, rope_parameters=dict(
                rope_type="axial", rope_theta=base))).to(device)

        def fn(q, k, positions):    # q, k [T, H, D]; transformers takes positions [T, 2]
            cos, sin = rotary(q, positions.T)
            return m.apply_rotary_pos_emb_vision(q, k, cos, sin)
        return fn, "transformers Qwen2VLVisionRotaryEmbedding + apply_rotary_pos_emb_vision"
    return (lambda q, k, positions: torch_mrope(q, k, positions, freqs)), \
        "plain PyTorch (no transformers model has 3-D axial RoPE)"


def reference(q, k, positions, freqs, grads):
    """fp64 outputs and gradients of q and k."""
    qd, kd = (x.detach().double().requires_grad_() for x in (q, k))
    cos, sin = gathered_cos_sin(positions, freqs, torch.float64)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    outs = tuple(x * cos + rotate_half(x) * sin for x in (qd, kd))
    return outs, torch.autograd.grad(outs, (qd, kd), [g.double() for g in grads])


def max_err(got, want) -> float:
    """max |got - want| / (1 + |want|) over pairs of tensors."""
    return max(float(((a.detach().double() - b.detach()).abs() / (1 + b.detach().abs())).max())
               for a, b in zip(got, want))


def case_inputs(case, tiny: bool, device):
    """(shape dict, freqs, positions, q, k, gq, gk) of a case: bf16, fresh from seed 0."""
    layout, B, S, HQ, HK, D, section, style, base = CASES[case]
    if tiny:
        B, S, HQ, HK, D, section = TINY[case]
    shape = dict(layout=layout, B=B, S=S, HQ=HQ, HK=HK, D=D, section=section, style=style,
                 base=base)
    freqs = mrope.multi_axis_frequencies(D, section, base, style=style, device=device)
    positions = positions_for(case, B, S, device)
    dims = (lambda h: (S, h, D)) if layout == "thd" else (lambda h: (B, S, h, D))
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, gq, gk = (torch.randn(dims(h), generator=g).to(device=device, dtype=torch.bfloat16)
                    for h in (HQ, HK, HQ, HK))
    return shape, freqs, positions, q, k, gq, gk


def compile_backend(timed: bool, device) -> str:
    """Inductor where it is timed on a GPU; aot_eager otherwise (Inductor's code needs a GPU
    in the interpreter runs, and an untimed check need not wait for it)."""
    return "inductor" if timed and torch.device(device).type == "cuda" else "aot_eager"


def measure_case(case: str, *, tiny: bool, timed: bool, device) -> list:
    """Rows of ropelib.apply_mrope_qk, a copy of q and k, transformers' code eagerly and
    compiled, for one case of CASES (`tiny`: its interpreter stand-in)."""
    shape, freqs, positions, q, k, gq, gk = case_inputs(case, tiny, device)
    layout = shape["layout"]
    ref_out, ref_grads = reference(q, k, positions, freqs, (gq, gk))
    try:
        hf_fn, hf_note = hf_function(case, shape["D"], shape["section"], shape["base"], freqs,
                                     device)
    except Exception as e:  # noqa: BLE001 -- transformers missing or changed: rows say why
        hf_fn, hf_note = _raises(e), "transformers' code did not load"
    providers = [
        ("ropelib", lambda q, k, p: ropelib.apply_mrope_qk(q, k, p, freqs, layout=layout), ""),
        ("copy", lambda q, k, p: (q.clone(), k.clone()), COPY_NOTE),
        ("hf_eager", hf_fn, hf_note),
        ("hf_compile", torch.compile(hf_fn, backend=compile_backend(timed, device),
                                     fullgraph=True), hf_note),
    ]
    base = _base_row(case, shape, tiny)
    return measure_providers(providers, base, (q, k), positions, (gq, gk), ref_out, ref_grads,
                             timed=timed, device=device)


def _raises(error: Exception):
    """A provider function that raises `error` when called (its rows then say why)."""
    def fn(*args):
        raise error
    return fn


def _base_row(case, shape, tiny, suffix="") -> dict:
    s = shape
    label = "tiny" if tiny else f"b{s['B']}-s{s['S']}-h{s['HQ']}/{s['HK']}-d{s['D']}"
    return dict(case=f"{case}{suffix}-{label}", dtype="bfloat16", layout=s["layout"], B=s["B"],
                S=s["S"], HQ=s["HQ"], HK=s["HK"], D=s["D"],
                section="/".join(map(str, s["section"])), style=s["style"])


def measure_providers(providers, base: dict, qk, extra, grads, ref_out, ref_grads, *,
                      timed: bool, device, inplace=()) -> list:
    """Check, then time, each provider `(name, fn(q, k, extra) -> (q', k'), note)` for the
    forward and the forward+backward; `inplace`: names of providers that rotate q and k in
    place (they get copies). Returns one row per (provider, pass) with ms (timed) and
    fraction_of_copy (when a `copy` provider was timed)."""
    q, k = qk
    nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
    rows, steps = [], {}
    for name, fn, note in providers:
        for backward in (False, True):
            row = dict(base, provider=name, note=note, available=True, reason="",
                       **{"pass": PASSES[backward]})
            rows.append(row)
            leaves = [(x.detach().clone() if name in inplace else x.detach())
                      .requires_grad_(backward) for x in (q, k)]
            try:
                out = fn(*leaves, extra)
                got = out + (torch.autograd.grad(out, leaves, grads) if backward else ())
            except Exception as exc:  # noqa: BLE001 -- recorded in the CSV, never hidden
                row.update(available=False, reason=f"{type(exc).__name__}: {exc}"[:200])
                continue
            if name == "copy":
                if not all(torch.equal(a, b) for a, b in zip(got, (q, k) + tuple(grads))):
                    row.update(available=False, reason="the copy differs from its input")
                    continue
            else:
                row["max_err"] = max_err(got, ref_out + (ref_grads if backward else ()))
                if not row["max_err"] <= TOL:       # NaN fails too
                    row.update(available=False, reason="differs from the fp64 reference")
                    continue
            if not timed:
                continue
            if name == "copy":      # device copies of q and k: once, twice for forward+backward
                steps[len(rows) - 1] = compare.copy_floor((q, k))[backward]
            elif backward:
                steps[len(rows) - 1] = compare.fwdbwd_step(
                    lambda fn=fn, leaves=leaves: fn(*leaves, extra), leaves, grads)
            else:
                def step(fn=fn, leaves=leaves):
                    fn(*leaves, extra)
                steps[len(rows) - 1] = step
    # every provider timed in turn, round after round: eager forward+backward at these sizes
    # costs the host about what it costs the GPU
    for i in compare.time_rows_in_rounds(rows, steps, device):
        rows[i]["gbps"] = nbytes * (1 + (rows[i]["pass"] == PASSES[True])) / rows[i]["ms"] / 1e6
    for r in rows:
        floor = next((e for e in rows if e["provider"] == "copy" and e["pass"] == r["pass"]
                      and e.get("ms")), None)
        if r.get("ms") and floor:
            r["fraction_of_copy"] = floor["ms"] / r["ms"]
    return rows


# --- transformers 4.x's materialised tables: ropelib's drop-in against Liger ------------------

def materialised_tables(positions, freqs, dtype=torch.bfloat16):
    """cos, sin [3, B, S, D] in `dtype`, as transformers 4.x's Qwen2VLRotaryEmbedding returns
    them: for each axis the angles of every pair at that axis's positions, cat(f, f), cos/sin in
    fp32 rounded once. Built with the plain 1-D ladder of freqs (mrope style)."""
    ang = positions[..., None].float() * freqs.inv_freq.float()         # [3, B, S, D/2]
    emb = torch.cat((ang, ang), -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def multimodal_rotary_4x(q, k, cos, sin, mrope_section, unsqueeze_dim=1):
    """transformers 4.x's apply_multimodal_rotary_pos_emb: each feature takes its axis's row
    (split + cat), then q * cos + rotate_half(q) * sin in the tables' dtype."""
    section = list(mrope_section) * 2
    cos = torch.cat([m[i % 3] for i, m in enumerate(cos.split(section, dim=-1))],
                    dim=-1).unsqueeze(unsqueeze_dim)
    sin = torch.cat([m[i % 3] for i, m in enumerate(sin.split(section, dim=-1))],
                    dim=-1).unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _tables_reference(q, k, cos, sin, section, grads):
    """fp64 outputs and gradients of transformers 4.x's formula on the given (rounded) tables,
    q and k in bshd."""
    qd, kd = (x.detach().double().requires_grad_() for x in (q, k))
    outs = multimodal_rotary_4x(qd, kd, cos.double(), sin.double(), section, unsqueeze_dim=2)
    return outs, torch.autograd.grad(outs, (qd, kd), [g.double() for g in grads])


def _liger_mrope():
    """Liger's M-RoPE autograd Function, or None and why."""
    try:
        from liger_kernel.ops.qwen2vl_mrope import LigerQwen2VLMRopeFunction
    except Exception as e:  # noqa: BLE001 -- not installed, or a broken install
        return None, f"liger_kernel.ops.qwen2vl_mrope does not import ({type(e).__name__})"
    return LigerQwen2VLMRopeFunction, ""


def _hf_layout(fn):
    """fn on [B, H, S, D] views of bshd q and k (transformers' layout over a bshd projection),
    as a function of bshd tensors returning bshd tensors."""
    def on_bshd(q, k, tables):
        qo, ko = fn(q.transpose(1, 2), k.transpose(1, 2), *tables)
        return qo.transpose(1, 2), ko.transpose(1, 2)
    return on_bshd


def measure_tables_case(case: str = "mrope", *, tiny: bool, timed: bool, device) -> list:
    """Rows of `ropelib.hf.apply_multimodal_rotary_pos_emb` against Liger's kernel, both on the
    same materialised bf16 cos/sin tables [3, B, S, D] (and transformers 4.x's formula eagerly
    and compiled, and a copy of q and k), for the mrope case. Liger rotates q and k in place;
    it gets copies of them. The tables are not counted in the copy: it moves q and k only."""
    shape, freqs, positions, q, k, gq, gk = case_inputs(case, tiny, device)
    section = shape["section"]
    tables = materialised_tables(positions, freqs)
    ref_out, ref_grads = _tables_reference(q, k, *tables, section, (gq, gk))
    liger, why_not = _liger_mrope()

    def ropelib_hf(q, k, cos, sin):
        return ropelib.hf.apply_multimodal_rotary_pos_emb(q, k, cos, sin, section)

    def liger_fn(q, k, cos, sin):
        if liger is None:
            raise ImportError(why_not)
        if q.device.type != "cuda":     # the interpreter gets its bf16 wrong (fp32 is right)
            raise RuntimeError("GPU only: Liger's kernel gives wrong bf16 values in Triton's "
                               "interpreter")
        return liger.apply(q, k, cos, sin, section)

    def hf_4x(q, k, cos, sin):
        return multimodal_rotary_4x(q, k, cos, sin, section)
    note = "[3, B, S, D] bf16 cos/sin tables"
    providers = [
        ("ropelib", _hf_layout(ropelib_hf), "ropelib.hf.apply_multimodal_rotary_pos_emb"),
        ("copy", lambda q, k, t: (q.clone(), k.clone()), COPY_NOTE),
        ("liger", _hf_layout(liger_fn), "Liger LigerQwen2VLMRopeFunction (in place)"),
        ("pytorch", _hf_layout(hf_4x), "transformers 4.x apply_multimodal_rotary_pos_emb"),
        ("torch.compile", _hf_layout(torch.compile(hf_4x, backend=compile_backend(timed, device),
                                                   fullgraph=True)),
         "torch.compile of transformers 4.x apply_multimodal_rotary_pos_emb"),
    ]
    base = dict(_base_row(case, shape, tiny, suffix="-tables"), tables=note)
    return measure_providers(providers, base, (q, k), tables, (gq, gk), ref_out, ref_grads,
                             timed=timed, device=device, inplace=("liger",))


def run(dry_run: bool, cases=tuple(CASES), tables: bool = False) -> list:
    """Every case of `cases` (and the tables comparison when `tables`): timed on a GPU, checked
    only on tiny shapes in a dry run."""
    device = runtime.default_device()
    if not dry_run and device != "cuda":
        raise SystemExit("timing needs a CUDA GPU; use --dry-run on the CPU")
    rows = [row for case in cases
            for row in measure_case(case, tiny=dry_run, timed=not dry_run, device=device)]
    if tables:
        rows += measure_tables_case("mrope", tiny=dry_run, timed=not dry_run, device=device)
    return rows


def table(rows) -> str:
    head = (f"{'case':<40} {'provider':<13} {'pass':<8} {'ms':>9} {'GB/s':>7} {'of copy':>8} "
            f"{'max err':>9}")
    out = [head, "-" * len(head)]
    for r in rows:
        lead = f"{r['case']:<40} {r['provider']:<13} {r['pass']:<8}"
        if not r["available"]:
            out.append(f"{lead} unavailable: {r['reason']}")
            continue
        ms = f"{r['ms']:9.3f}" if r.get("ms") else f"{'-':>9}"
        gb = f"{r['gbps']:7.0f}" if r.get("gbps") else f"{'-':>7}"
        frac = f"{r['fraction_of_copy']:8.2f}" if r.get("fraction_of_copy") else f"{'-':>8}"
        err = f"{r['max_err']:9.2e}" if r.get("max_err") is not None else f"{'-':>9}"
        out.append(f"{lead} {ms} {gb} {frac} {err}")
    return "\n".join(out)


def write(rows, path, script: str) -> str:
    """The rows as a CSV with the environment header (GPU, versions, date)."""
    meta = compare.environment_meta()
    meta["script"] = script
    meta["bytes_model"] = "q and k read + written once per pass (positions, freqs not counted)"
    meta["timing"] = "triton.testing.do_bench median ms (p20, p80)" if runtime.on_gpu() else \
        "none (dry run: outputs checked only)"
    return compare.write_csv(rows, str(path), meta=meta)
