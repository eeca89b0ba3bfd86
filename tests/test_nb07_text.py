"""Numbers notebook 07's prose states that no cell of it asserts: read from the code and the
committed files they come from."""
from ropelib.bench import compare
from ropelib.course import measured

MIB = 2**20


def test_the_standard_sweeps_are_the_ones_section_4_describes():
    # "sequence length 256 ... 3840 at batch 1, 2, 4, 8 (64 heads of 128, fp32 and bf16) for
    # ropelib, its earlier batch-reuse kernel, TE's fused kernel and eager PyTorch"
    seq = [s for s in compare.SEED_SWEEPS if s.name.startswith("seq_len-")]
    assert sorted((s.base.batch, s.base.dtype) for s in seq) == sorted(
        (b, d) for b in (1, 2, 4, 8) for d in ("fp32", "bf16"))
    for s in seq:
        assert s.axis == "seq_len" and (s.values[0], s.values[-1]) == (256, 3840)
        assert (s.base.heads, s.base.head_dim) == (64, 128)
        assert s.providers == ("ropelib", "ropelib_batch_reuse", "te_fused", "pytorch")
    # "bf16 sweeps of sequence, head dim, heads and batch around a 32 MiB base, adding TE's
    # unfused path and torch.compile": S = 2048, B = 2, H = 32, D = 128
    axes = {s.name: s for s in compare.SEED_SWEEPS if not s.name.startswith("seq_len-")}
    assert {n: s.axis for n, s in axes.items()} == {
        "seq-bf16": "seq_len", "hidden-bf16": "head_dim", "heads-bf16": "heads",
        "batch-bf16": "batch"}
    for s in axes.values():
        b = s.base
        assert (b.seq_len, b.batch, b.heads, b.head_dim, b.dtype) == (2048, 2, 32, 128, "bf16")
        assert b.seq_len * b.batch * b.heads * b.head_dim * 2 == 32 * MIB
        assert {"te_unfused", "torch.compile"} <= set(s.providers)


def test_the_program_start_rate_section_7_quotes_from_notebook_03():
    # "the GPU starts about one every 0.6 ns ... across the 132 SMs of an H100 or H200 is one
    # every 80 ns on each": notebook 03's H200 run of the empty kernel and its H100 run confined
    # to fewer SMs (with all 132, the same rate)
    cost_meta, cost_rows = measured.load("program_cost")
    empty = next(r for r in cost_rows if r["kernel"] == "empty" and r["num_warps"] == 1)
    assert cost_meta["gpu"] == "NVIDIA H200" and empty["sms"] == 132
    assert round(empty["us"] * 1e3 / empty["programs"], 1) == 0.6
    assert round(empty["ns_per_program_per_sm"]) == 80
    sms_csv = measured.RESULTS / "program_start_sms-nvidia-h100-80gb-hbm3-20261207-1704.csv"
    assert compare.read_meta(sms_csv)["gpu"] == "NVIDIA H100 80GB HBM3"
    every_sm = max(compare.read_csv(sms_csv), key=lambda r: r["sms_used"])
    assert every_sm["sms_used"] == 132
    assert round(every_sm["ns_per_program"], 1) == 0.6
    assert round(every_sm["ns_per_program_per_sm"]) == 80


def test_the_host_timing_log_is_what_a5_says():
    # A.5: "50 back to back, best of five rounds", at decode size, 64 and 256 MiB, on an H200
    log = measured.RESULTS / "host_by_size-nvidia-h200-20261204-1600.log"
    first = log.read_text().splitlines()[0]
    assert first.startswith("# NVIDIA H200,") and first.endswith(
        "best of 5 rounds of 50 calls")


def test_the_pass_of_pairs_was_first_timed_after_the_sweeps():
    # section 5: the sweeps at 04:10 UTC on 29 November, paired_rows_probe first at 06:50
    assert compare.read_meta(measured.RESULTS / "seed_sweeps.csv")["date"].startswith(
        "2026-11-29T04:10")
    assert measured.load("paired_rows_probe")[0]["date"].startswith("2026-11-29T06:50")
