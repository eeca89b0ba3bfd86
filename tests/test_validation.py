"""Bad input: every case raises ValueError/TypeError naming the argument, before any kernel runs;
an in-place call that fails leaves its input untouched.

"Before any kernel runs" is checked by replacing the launcher with one that fails the test.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ropelib
from ropelib.kernels import launch, planning
from ropelib import hf as rhf
from ropelib import te as rte

S, B, H, D = 8, 2, 2, 16


@pytest.fixture(autouse=True)
def no_kernel(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched for bad input")
    monkeypatch.setattr(launch, "run", boom)
    monkeypatch.setattr(planning, "start", boom)
    yield


def x4(layout="sbhd", dtype=torch.float32, s=S):
    return torch.randn((s, B, H, D) if layout == "sbhd" else (B, s, H, D)).to(dtype)


F = ropelib.rope_freqs(2 * S + 4, D)

CASES = [
    # (id, callable, exception, regex naming the argument)
    ("rank-sbhd-3d", lambda: ropelib.apply_rope(torch.randn(S, H, D), F), ValueError, r"\bx\b.*4-D"),
    ("rank-thd-4d", lambda: ropelib.apply_rope(x4(), F, layout="thd",
                                               cu_seqlens=torch.tensor([0, S])), ValueError, r"3-D"),
    ("bad-layout", lambda: ropelib.apply_rope(x4(), F, layout="hbsd"), ValueError, "layout"),
    ("non-float-x", lambda: ropelib.apply_rope(torch.ones(S, B, H, D, dtype=torch.int32), F),
     TypeError, r"\bx\b.*dtype"),
    ("x-not-tensor", lambda: ropelib.apply_rope([[1.0]], F), TypeError, r"\bx\b"),
    ("freqs-bad-shape", lambda: ropelib.apply_rope(x4(), torch.zeros(S, 2, 1, D)), ValueError, "freqs"),
    ("freqs-int", lambda: ropelib.apply_rope(x4(), torch.zeros(S, D, dtype=torch.int64)), TypeError, "freqs"),
    ("odd-rotary", lambda: ropelib.apply_rope(x4(), torch.zeros(S, 7)), ValueError, "rotary dim"),
    ("rotary-too-large", lambda: ropelib.apply_rope(x4(), torch.zeros(S, 2 * D)), ValueError,
     "larger than the head dim"),
    ("freqs-and-cos", lambda: ropelib.apply_rope(x4(), F, cos=torch.zeros(S, D), sin=torch.zeros(S, D)),
     ValueError, "freqs"),
    ("cos-without-sin", lambda: ropelib.apply_rope(x4(), cos=torch.zeros(S, D)), ValueError, "sin"),
    ("cos-sin-shape", lambda: ropelib.apply_rope(x4(), cos=torch.zeros(S, D), sin=torch.zeros(S, D - 2)),
     ValueError, "cos and sin"),
    ("table-too-short", lambda: ropelib.apply_rope(x4(), ropelib.rope_freqs(S - 1, D)), ValueError,
     r"freqs/cos|positions"),
    ("cos-too-short", lambda: ropelib.apply_rope(x4(), cos=torch.zeros(S - 1, D), sin=torch.zeros(S - 1, D)),
     ValueError, "positions"),
    ("table-too-short-cp", lambda: ropelib.apply_rope(x4(), ropelib.rope_freqs(S + 2, D), cp_size=2),
     ValueError, "cp_size"),
    ("start-too-large", lambda: ropelib.apply_rope(x4(), ropelib.rope_freqs(S + 3, D),
                                                   start_positions=torch.tensor([0, 4])),
     ValueError, "start_positions"),
    ("start-negative", lambda: ropelib.apply_rope(x4(), F, start_positions=torch.tensor([-1, 0])),
     ValueError, "start_positions"),
    ("start-wrong-len", lambda: ropelib.apply_rope(x4(), F, start_positions=torch.tensor([0, 1, 2])),
     ValueError, "start_positions"),
    ("start-float", lambda: ropelib.apply_rope(x4(), F, start_positions=torch.tensor([0.0, 1.0])),
     TypeError, "start_positions"),
    ("pos-ids-too-large", lambda: ropelib.apply_rope(x4(), ropelib.rope_freqs(S, D),
                                                     position_ids=torch.arange(S) + 1),
     ValueError, "position_ids"),
    ("pos-ids-negative", lambda: ropelib.apply_rope(x4(), F, position_ids=torch.arange(S) - 1),
     ValueError, "position_ids"),
    ("pos-ids-wrong-shape", lambda: ropelib.apply_rope(x4(), F, position_ids=torch.arange(S + 1)),
     ValueError, "position_ids"),
    ("pos-ids-and-start", lambda: ropelib.apply_rope(x4(), F, position_ids=torch.arange(S),
                                                     start_positions=torch.tensor([0, 1])),
     ValueError, "position_ids"),
    ("pos-ids-thd-2d", lambda: ropelib.apply_rope(torch.randn(S, H, D), F, layout="thd",
                                                  position_ids=torch.arange(S)[None]),
     ValueError, "position_ids"),
    ("thd-no-cu", lambda: ropelib.apply_rope(torch.randn(S, H, D), F, layout="thd"), ValueError,
     "cu_seqlens"),
    ("cu-not-zero", lambda: ropelib.apply_rope(torch.randn(S, H, D), F, layout="thd",
                                               cu_seqlens=torch.tensor([1, 4, S])), ValueError,
     "cu_seqlens must start at 0"),
    ("cu-decreasing", lambda: ropelib.apply_rope(torch.randn(S, H, D), F, layout="thd",
                                                 cu_seqlens=torch.tensor([0, 6, 3, S])), ValueError,
     "cu_seqlens must be non-decreasing"),
    ("cu-total", lambda: ropelib.apply_rope(torch.randn(S, H, D), F, layout="thd",
                                            cu_seqlens=torch.tensor([0, 3, S + 1])), ValueError,
     "cu_seqlens"),
    ("cu-cp-divisible", lambda: ropelib.apply_rope(torch.randn(S, H, D), F, layout="thd", cp_size=2,
                                                   cu_seqlens=torch.tensor([0, 6, 2 * S])),
     ValueError, "2\\*cp_size"),
    ("cu-float", lambda: ropelib.apply_rope(torch.randn(S, H, D), F, layout="thd",
                                            cu_seqlens=torch.tensor([0.0, S])), TypeError, "cu_seqlens"),
    ("cu-one-entry", lambda: ropelib.apply_rope(torch.randn(S, H, D), F, layout="thd",
                                                cu_seqlens=torch.tensor([0])), ValueError, "cu_seqlens"),
    ("cu-with-sbhd", lambda: ropelib.apply_rope(x4(), F, cu_seqlens=torch.tensor([0, S])), ValueError,
     "cu_seqlens"),
    ("thd-start-too-large", lambda: ropelib.apply_rope(torch.randn(S, H, D), ropelib.rope_freqs(6, D),
                                                       layout="thd", cu_seqlens=torch.tensor([0, 3, S]),
                                                       start_positions=torch.tensor([0, 2])),
     ValueError, "start_positions"),
    ("thd-start-wrong-len", lambda: ropelib.apply_rope(torch.randn(S, H, D), F, layout="thd",
                                                       cu_seqlens=torch.tensor([0, 3, S]),
                                                       start_positions=torch.tensor([0])),
     ValueError, "start_positions"),
    ("cp-rank-range", lambda: ropelib.apply_rope(x4(), F, cp_size=2, cp_rank=2), ValueError, "cp_rank"),
    ("cp-rank-negative", lambda: ropelib.apply_rope(x4(), F, cp_size=2, cp_rank=-1), ValueError, "cp_rank"),
    ("cp-size-zero", lambda: ropelib.apply_rope(x4(), F, cp_size=0), ValueError, "cp_size"),
    ("cp-odd-local-seq", lambda: ropelib.apply_rope(x4(s=7), F, cp_size=2), ValueError, "even"),
    ("interleaved-not-bool", lambda: ropelib.apply_rope(x4(), F, interleaved="yes"), TypeError,
     "interleaved"),
    ("meta-freqs", lambda: ropelib.apply_rope(x4(), F.to("meta")), ValueError, "freqs"),
    ("meta-start", lambda: ropelib.apply_rope(x4(), F, start_positions=torch.tensor([0, 1], device="meta")),
     ValueError, "start_positions"),
    ("meta-x", lambda: ropelib.apply_rope(x4().to("meta"), F.to("meta")), ValueError, r"\bx\b"),
    ("qk-dtype", lambda: ropelib.apply_rope_qk(x4(), x4(dtype=torch.bfloat16), F), TypeError, "q and k"),
    ("qk-device", lambda: ropelib.apply_rope_qk(x4(), x4().to("meta"), F), ValueError, r"\bk\b"),
    ("qk-seq", lambda: ropelib.apply_rope_qk(x4(), x4(s=4), F), ValueError, "q and k"),
    ("qk-kfreqs-rot", lambda: ropelib.apply_rope_qk(x4(), x4(), F, k_freqs=ropelib.rope_freqs(2 * S, D, rotary_percent=0.5)),
     ValueError, "rotary dim"),
    ("overlap-inplace", lambda: ropelib.apply_rope(torch.randn(1, B, H, D).expand(S, B, H, D), F, inplace=True),
     ValueError, "inplace"),
    ("qk-overlapping-inplace", lambda: (lambda t: ropelib.apply_rope_qk(t[:, :, :2], t[:, :, 1:], F, inplace=True))(x4()),
     ValueError, "inplace"),
    # drop-ins
    ("te-bad-format", lambda: rte.apply_rotary_pos_emb(x4(), F, tensor_format="sbdh", fused=True), ValueError, "layout"),
    ("te-unfused-too-short", lambda: rte.apply_rotary_pos_emb(x4(), ropelib.rope_freqs(4, D), fused=False),
     ValueError, "freqs"),
    ("te-unfused-rank", lambda: rte.apply_rotary_pos_emb(torch.randn(S, H, D), F), ValueError, r"\bt\b"),
    ("qkv-split-len", lambda: rte.apply_fused_qkv_rotary_pos_emb(torch.randn(S, B, 2, 48), F, F, [32, 16]),
     ValueError, "qkv_split_arg_list"),
    ("qkv-split-sum", lambda: rte.apply_fused_qkv_rotary_pos_emb(torch.randn(S, B, 2, 48), F, F, [16, 16, 8]),
     ValueError, "qkv"),
    ("qkv-split-multiple", lambda: rte.apply_fused_qkv_rotary_pos_emb(torch.randn(S, B, 2, 56), F, F, [24, 16, 16]),
     ValueError, "qkv_split_arg_list"),
    ("qkv-split-nonpositive", lambda: rte.apply_fused_qkv_rotary_pos_emb(torch.randn(S, B, 2, 32), F, F, [16, 16, 0]),
     ValueError, "qkv_split_arg_list"),
    ("qkv-thd", lambda: rte.apply_fused_qkv_rotary_pos_emb(torch.randn(S, 2, 48), F, F, [16, 16, 16],
                                                           tensor_format="thd"), ValueError, "tensor_format"),
    ("qkv-freqs-mismatch", lambda: rte.apply_fused_qkv_rotary_pos_emb(torch.randn(S, B, 2, 48), F,
                                                                      ropelib.rope_freqs(2 * S, D, rotary_percent=0.5),
                                                                      [16, 16, 16]), ValueError, "k_freqs"),
    ("qkv-table-short", lambda: rte.apply_fused_qkv_rotary_pos_emb(torch.randn(S, B, 2, 48), ropelib.rope_freqs(4, D),
                                                                   F, [16, 16, 16]), ValueError, "positions"),
    ("hf-unsqueeze", lambda: rhf.apply_rotary_pos_emb(x4(), x4(), torch.zeros(B, S, D), torch.zeros(B, S, D),
                                                      unsqueeze_dim=3), ValueError, "unsqueeze_dim"),
    ("hf-partial", lambda: rhf.apply_rotary_pos_emb(torch.randn(B, H, S, D), torch.randn(B, H, S, D),
                                                    torch.zeros(B, S, D // 2), torch.zeros(B, S, D // 2)),
     ValueError, "head_dim"),
    ("hf-cos-seq", lambda: rhf.apply_rotary_pos_emb(torch.randn(B, H, S, D), torch.randn(B, H, S, D),
                                                    torch.zeros(B, S + 1, D), torch.zeros(B, S + 1, D)),
     ValueError, "cos/sin"),
    ("hf-qk-dtype", lambda: rhf.apply_rotary_pos_emb(torch.randn(B, H, S, D), torch.randn(B, H, S, D).half(),
                                                     torch.zeros(B, S, D), torch.zeros(B, S, D)),
     TypeError, "q and k"),
    ("hf-rank", lambda: rhf.apply_rotary_pos_emb(torch.randn(H, S, D), torch.randn(H, S, D),
                                                 torch.zeros(S, D), torch.zeros(S, D)), ValueError, r"\bq\b"),
    ("module-layout", lambda: ropelib.RotaryEmbedding(D, layout="hsd"), ValueError, "layout"),
]


@pytest.mark.parametrize("fn,exc,pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_raises_before_kernel(fn, exc, pattern):
    with pytest.raises(exc, match=pattern):
        fn()


def test_no_kernel_fixture_is_effective():
    with pytest.raises(AssertionError, match="kernel was launched"):
        ropelib.apply_rope(x4(), F)


@pytest.mark.parametrize("kwargs", [
    dict(start_positions=torch.tensor([0, 100])),
    dict(cp_size=2, cp_rank=3),
    dict(position_ids=torch.arange(S) + 100),
    dict(freqs=torch.zeros(S, 2 * D)),
], ids=["start", "cp_rank", "position_ids", "rotary_dim"])
def test_failed_inplace_leaves_input_untouched(kwargs):
    x = x4()
    before = x.clone()
    kw = dict(kwargs)
    freqs = kw.pop("freqs", F)
    with pytest.raises(ValueError):
        ropelib.apply_rope(x, freqs, inplace=True, **kw)
    assert torch.equal(x, before)
    q, k = x4(), x4()
    qb, kb = q.clone(), k.clone()
    with pytest.raises(ValueError):
        ropelib.apply_rope_qk(q, k, freqs, inplace=True, **kw)
    assert torch.equal(q, qb) and torch.equal(k, kb)


def test_cpu_without_interpreter_says_so(tmp_path):
    code = textwrap.dedent("""
        import torch, ropelib
        x = torch.randn(4, 1, 1, 8)
        try:
            ropelib.apply_rope(x, ropelib.rope_freqs(4, 8))
        except ValueError as e:
            print("MSG:", e)
        else:
            print("NO ERROR")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "MSG:" in out.stdout, out.stdout
    assert "TRITON_INTERPRET=1" in out.stdout and "x is a CPU tensor" in out.stdout

