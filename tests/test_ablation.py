"""benchmarks/ablation.py: every variant computes RoPE correctly (the dry run, in the interpreter),
each variant changes one factor of the launch, and the CSV reads back with ropelib.bench.compare."""
import os
from pathlib import Path

import pytest
import torch
from loading import load_file  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the script's @triton.jit runs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ablation():
    mod = load_file("ablation", ROOT / "benchmarks" / "ablation.py")
    return mod


def test_dry_run_checks_every_variant_and_writes_a_readable_csv(ablation, tmp_path, capsys):
    from ropelib.bench import compare
    out = tmp_path / "ablation.csv"
    assert ablation.main(["--dry-run", "--out", str(out)]) == 0
    rows = compare.read_csv(out)
    meta = compare.read_meta(out)
    assert meta["script"] == "benchmarks/ablation.py" and "dry run" in meta["timing"]
    names = {r["variant"] for r in rows}
    want = {"copy", "te_fused", "ropelib_naive", "ropelib_batch_reuse", "ropelib_finished"}
    want |= {v[0] for H in (3, 4) for v in ablation.variants(H)}
    assert want <= names
    assert {r["case"] for r in rows} == {"tiny", "tiny-b1"}
    for r in rows:
        if r["variant"] in ("copy", "te_fused"):
            continue
        assert r["available"] is True, (r["case"], r["variant"], r["reason"])
        assert 0 <= r["max_head_ulp_err"] <= 1.0
        assert r["ms"] is None          # a dry run times nothing
    assert "failed" not in capsys.readouterr().out


def test_each_variant_changes_one_factor(ablation):
    S, B, H, D = 4096, 8, 32, 128
    cols = {name: ablation.shape_columns(S, B, H, D, opts)
            for name, _, _, opts in ablation.variants(H)}
    base = cols["sh_loop_b"]
    assert base["grid"] == "4096x32x1" and base["batch_per_program"] == B
    assert base["cos_sin_per_position"] == H * D          # the (S, H) grid: H programs per position
    assert cols["sh_one_b"]["grid"] == "4096x32x8"
    assert cols["sh_one_b"]["cos_sin_per_position"] == B * H * D
    assert cols["heads_all_one_b"]["grid"] == "4096x1x8"  # TE's grid (s, b)
    assert cols["heads_all_one_b"]["cos_sin_per_position"] == B * D
    assert cols["sh_loop_b_table"]["cos_sin_per_position"] == 0
    assert cols["sh_loop_b_unrolled"]["batch_loop"] == "unrolled"
    keys = ("heads_per_program", "batch_per_program", "batch_loop", "cos_sin", "num_warps")

    def diff(a, b):
        return {k for k in keys if a[k] != b[k]}
    for name, c in cols.items():  # each variant has a neighbour that differs in one factor only
        steps = [diff(c, o) for other, o in cols.items() if other != name]
        # warps follow the tile unless a variant sets them: a tile change may move them too
        assert any(d == {"num_warps"} or len(d - {"num_warps"}) == 1 for d in steps), name


def test_a_wrong_variant_is_caught(ablation, monkeypatch):
    # The dry run's check is real: a kernel launched with the wrong half size fails it.
    original = ablation.rope_ablation

    def broken(x, freqs2d, cos2d, sin2d, **opts):
        y = original(x, freqs2d, cos2d, sin2d, **opts)
        return y.roll(1, dims=-1)
    monkeypatch.setattr(ablation, "rope_ablation", broken)
    rows = ablation.run(dry_run=True, progress=False)
    bad = [r for r in rows if r["variant"] == "sh_loop_b"]
    assert bad and all(r["available"] is False and "differs" in r["reason"] for r in bad)


def test_timing_needs_a_gpu(ablation):
    if torch.cuda.is_available():
        pytest.skip("on a GPU the real run is allowed")
    with pytest.raises(SystemExit):
        ablation.run(dry_run=False, progress=False)
    with pytest.raises(SystemExit):   # the committed CSV never receives dry-run rows
        ablation.main(["--dry-run", "--out", str(ablation.CSV_PATH)])
