"""Notebook 05's checks on the committed H200 measurements, out of the learner's way.

Each function prints the tables a section of `notebooks/05-finished-kernel.py` reads and asserts
every number that section's prose states, so a changed CSV or a changed sentence fails loudly
(AssertionError) instead of leaving the prose wrong. They read only committed files under
`benchmarks/results/` (and, where they say so, compile for sm_90 on this machine), so they run on
a CPU. `tests/test_nb05_checks.py` runs them.
"""
import math
import re

import torch
import triton

from ropelib.bench import compare
from ropelib.course import ladder, measured


def said(v, digits=3):
    """A number as the prose writes it."""
    return f"{v:.{digits}f}"


def r(v, digits=1):
    return round(v, digits)


def ladder_claims(rows, meta, mech, mech_meta, hatched, named, sms, knobs, compile_errors):
    """Section 5: the ladder CSV's steps (rows with `pct_of_copy` as the notebook reads it: the
    copy's median time over the kernel's) and the mechanism CSV (`mech`, s4096-b8), printed as
    the section's tables and checked against its prose. Returns the steps and the mechanism
    column (`by_case`, `step`, `MECHANISM`)."""
    SMS_H200, H200_KNOBS, COMPILE_ERRORS = sms, knobs, compile_errors
    by_case = {}
    for r in rows:
        by_case.setdefault(r["case"], {})[r["provider"]] = r["pct_of_copy"]
    for case, pct in by_case.items():
        steps = [name for name in ladder.NAMES if name in pct]
        gains = {b: pct[b] - pct[a] for a, b in zip(steps, steps[1:])}
        if case != "s16-b64":
            # the tile of heads is the largest single step
            assert max(gains, key=gains.get) == "heads", (case, gains)
            assert pct["ropelib"] > pct["batch_reuse"] + 10, (case, pct)
    # the tile of heads: 32 times fewer programs, about half the warp instructions per element,
    # over six times the x asked for per SM (the mechanism CSV, s4096-b8)
    br_h, heads_h = mech["batch_reuse"], mech["heads"]
    assert br_h["programs"] == 32 * heads_h["programs"]
    assert round(heads_h["ncu_warp_inst_per_element"] / br_h["ncu_warp_inst_per_element"], 1) \
        == 0.5
    assert 6 < heads_h["x_kib_per_sm"] / br_h["x_kib_per_sm"] < 7
    # ... and notebook 04's variants at the same size, one change at a time (the text above)
    HEADS_STEP = ("batch_reuse", "sh_loop_b_w2", "sh_loop_b_table", "heads2_loop_b",
                  "heads4_loop_b", "heads8_loop_b_w2", "heads", "equal_halves", "ropelib")
    print(measured.table([named(mech[v]) for v in HEADS_STEP], [
        ("variant", "variant", ""), ("us", "us", ".1f"), ("programs", "programs", ","),
        ("warps", "num_warps", "d"), ("x B/warp/step", "x_bytes_per_warp_step", ".0f"),
        ("occ. %", "ncu_achieved_occupancy_pct", ".0f"),
        ("warp inst/elem", "ncu_warp_inst_per_element", ".2f")]))
    hs = {v: mech[v] for v in HEADS_STEP}
    assert [said(hs[v]["us"], 1) for v in HEADS_STEP] == [
        "179.1", "178.1", "169.9", "147.6", "137.2", "136.3", "142.2", "137.2", "138.6"]
    assert hs["sh_loop_b_w2"]["programs"] == hs["batch_reuse"]["programs"] == 131072
    assert hs["sh_loop_b_w2"]["x_bytes_per_warp_step"] == 128       # "128 bytes of x a warp"
    # eight heads a program on 1, 2, 4, 8 warps: times and achieved occupancy
    H8_WARPS = [f"heads8_loop_b_w{w}" for w in (1, 2, 4, 8)]
    print("eight heads a program on 1, 2, 4, 8 warps: "
          + ", ".join(f"{mech[v]['us']:.1f} us at {mech[v]['ncu_achieved_occupancy_pct']:.0f} %"
                      for v in H8_WARPS))
    assert [said(mech[v]["us"], 1) for v in H8_WARPS] == ["138.1", "136.3", "139.6", "146.8"]
    assert [round(mech[v]["ncu_achieved_occupancy_pct"]) for v in H8_WARPS] == [29, 51, 68, 87]
    assert max(H8_WARPS, key=lambda v: mech[v]["us"]) == max(
        H8_WARPS, key=lambda v: mech[v]["ncu_achieved_occupancy_pct"])    # the most occupied
    # the warps step in the mechanism profile (the cycles profile's is asserted below)
    assert [said(mech[v]["us"], 1) for v in ("warps", "heads")] == ["141.5", "142.2"]
    assert [round(hs[v]["ncu_achieved_occupancy_pct"]) for v in
            ("batch_reuse", "sh_loop_b_w2", "heads4_loop_b", "heads8_loop_b_w2")] == \
        [48, 94, 92, 51]
    assert [said(hs[v]["ncu_warp_inst_per_element"], 2) for v in
            ("batch_reuse", "sh_loop_b_table")] == ["0.51", "0.31"]
    assert round(hs["batch_reuse"]["us"] - hs["sh_loop_b_table"]["us"]) == 9    # "about 9 µs"
    assert (hs["heads2_loop_b"]["programs"], hs["heads2_loop_b"]["num_warps"]) == (65536, 1)
    assert hs["heads4_loop_b"]["num_warps"] == hs["heads8_loop_b_w2"]["num_warps"] == 2
    # the 4-heads, 2-warp variant: level with rung 6 and the finished kernel, ahead of heads
    assert abs(hs["heads4_loop_b"]["us"] - hs["equal_halves"]["us"]) < 0.01 * hs["ropelib"]["us"]
    assert hs["heads4_loop_b"]["us"] < hs["ropelib"]["us"] < hs["heads"]["us"]
    # one, two, four heads a program: faster each time; eight or 32: no faster than four
    assert hs["batch_reuse"]["us"] > hs["heads2_loop_b"]["us"] > hs["heads4_loop_b"]["us"]
    assert min(hs[v]["us"] for v in ("heads8_loop_b_w2", "heads")) > \
        0.99 * hs["heads4_loop_b"]["us"]
    # the introduction's "about nine tenths" of a copy for the finished kernel
    assert 88 <= by_case["s4096-b8"]["ropelib"] <= 92
    # b = 1: from about a fifth of a copy to about three quarters with the tile of heads
    assert by_case["s32768-b1"]["batch_reuse"] < 30 and by_case["s32768-b1"]["heads"] > 65
    idea = {r["provider"]: r["idea"] for r in rows if r["case"] == "s4096-b8"}
    assert "finished kernel (route forced)" in idea["ropelib"]
    assert "as planned" in idea["ropelib_planned"]
    assert mech_meta["date"][:10] == meta["date"][:10]    # profiled the same day
    print(measured.table([mech[n] for n in ladder.NAMES if n in mech]
                         + [named(mech["ropelib"]), named(mech["ropelib_planned"])], [
        ("rung", "variant", ""), ("us", "us", ".0f"), ("programs", "programs", ","),
        ("warps", "num_warps", "d"), ("occ. %", "ncu_achieved_occupancy_pct", ".0f"),
        ("warp inst/elem", "ncu_warp_inst_per_element", ".2f"),
        ("SM thr. %", "ncu_sm_throughput_pct", ".1f"),
        ("DRAM/model", "ncu_dram_bytes_over_model", ".3f")]))

    # how well the run measured the rungs compared below: the width of their 20-80 %
    # quantiles, as % of the median
    spread = max((r["ms_p80"] - r["ms_p20"]) / r["ms"] * 100 for r in rows
                 if r["case"] == "s4096-b8" and r["provider"] in
                 ("warps", "chunks", "accurate", "equal_halves", "ropelib"))
    big = by_case["s4096-b8"]
    large_cases = ("s4096-b8", "s16384-b8-h8", "s32768-b1")
    chunk_step, halves_step = big["chunks"] - big["warps"], big["equal_halves"] - big["accurate"]
    print(f"s4096-b8: 20-80 % quantiles at most {spread:.1f} % of the median apart; chunks "
          f"{chunk_step:+.1f} points, equal halves {halves_step:+.1f} points")
    assert said(spread, 1) == "1.2" and chunk_step < -2 * spread and halves_step > 2 * spread
    assert (round(-chunk_step), round(halves_step)) == (3, 5)    # "about three", "about five"

    # what each rung buys: its step in points of a copy at every size, and whether this
    # notebook measured a mechanism for it
    MECHANISM = {
        "heads": "work per program (notebook 04's variants, above)",
        "tile": "b = 8: no step; b = 1 (BLOCK_S = 1): 3 % more instructions, lower occupancy",
        "warps": "b = 8: level; b = 1: each sin/cos evaluated 32 times, not 16",
        "chunks": "b = 1: each sin/cos once; b = 8: 16.1 MB more reach DRAM in its time",
        "accurate": "none: the same machine code (Triton 3.6)",
        "equal_halves": "DRAM rate 3.49 -> 3.65 TB/s, 16.4 MB fewer writes in its time; "
                        "0.6 more warps a scheduler waiting on loads"}
    cases = list(by_case)
    step = {case: {b: by_case[case][b] - by_case[case][a]
                   for a, b in zip(ladder.NAMES, ladder.NAMES[1:])} for case in cases}
    print(f"\n{'step, points of a copy':22s}" + "".join(f"{c:>14s}" for c in cases)
          + "  mechanism")
    for name in ladder.NAMES[1:]:
        print(f"  {name:20s}" + "".join(f"{step[c][name]:+14.1f}" for c in cases)
              + f"  {MECHANISM[name]}")
    said_steps = {(c, n): said(step[c][n], 1) for c in cases for n in ladder.NAMES[1:]}
    # the tile rung: nothing at b = 8 (32 heads or 8), a loss at b = 1 on the same grid
    assert all(abs(step[c]["tile"]) < 0.5 for c in ("s4096-b8", "s16384-b8-h8"))
    assert [said_steps[c, "tile"] for c in ("s4096-b8", "s16384-b8-h8")] == ["-0.1", "-0.3"]
    assert said_steps["s32768-b1", "tile"] == "-5.9"
    assert [said(by_case["s32768-b1"][n], 1) for n in ("heads", "tile")] == ["73.6", "67.7"]
    assert said(by_case["s16384-b8-h8"]["heads"], 1) == "91.7"
    h8_heads = ladder.plan("heads", 16384, 8, 8, 128, 2, SMS_H200, H200_KNOBS)
    h8_tile = ladder.plan("tile", 16384, 8, 8, 128, 2, SMS_H200, H200_KNOBS)
    b1_heads = ladder.plan("heads", 32768, 1, 32, 128, 2, SMS_H200, H200_KNOBS)
    b1_tile = ladder.plan("tile", 32768, 1, 32, 128, 2, SMS_H200, H200_KNOBS)
    print(f"h = 8: heads rung {h8_heads}\n       tile rung  {h8_tile}")
    assert math.prod(h8_heads.grid) == 16384 and h8_heads.block_s == 1
    assert (math.prod(h8_tile.grid), h8_tile.block_s, h8_tile.block_h) == (4096, 4, 8)
    assert (b1_heads.grid, b1_heads.num_warps) == (b1_tile.grid, b1_tile.num_warps)
    # ... and the same one-token tile: at h = 32 the tile rung's BLOCK_S is 1
    assert (b1_tile.block_s, b1_tile.block_h) == (1, b1_heads.block_h) == (1, 32)
    # accurate: no step at the three large sizes (rungs 4 and 5 the same code, section 5's
    # opcode profile); equal halves: more at b = 8 than at b = 1
    assert all(abs(step[c]["accurate"]) < 0.5 for c in large_cases)
    assert [said_steps[c, "equal_halves"] for c in ("s4096-b8", "s32768-b1")] == ["5.5", "4.9"]
    # the summary table's warps and chunks rows
    assert [said_steps[c, "warps"] for c in ("s4096-b8", "s32768-b1")] == ["1.8", "-29.6"]
    # "level within the runs' spread": under 2 points, where the cycles profile (next cell) has
    # the warps rung slower than the heads rung
    assert abs(step["s4096-b8"]["warps"]) < 2
    assert said_steps["s32768-b1", "chunks"] == "48.1"

    # chunks: the same programs, about the same instructions, the same DRAM reads; the writes
    # counted differ
    m = mech
    MB = 1e6
    for v in ("warps", "chunks"):
        print(f"  {v:13s} DRAM read {m[v]['ncu_dram_read_bytes'] / MB:6.1f} MB, written "
              f"{m[v]['ncu_dram_write_bytes'] / MB:6.1f} MB: "
              f"{m[v]['ncu_dram_bytes_over_model']:.3f} of the model")
    assert m["chunks"]["programs"] == m["warps"]["programs"]
    assert abs(m["chunks"]["ncu_warp_inst_per_element"]
               - m["warps"]["ncu_warp_inst_per_element"]) < 0.02
    assert abs(m["chunks"]["ncu_dram_read_bytes"] / m["warps"]["ncu_dram_read_bytes"] - 1) < 2e-4
    assert [said(m[v]["ncu_dram_bytes_over_model"], 2) for v in ("warps", "chunks")] == \
        ["0.96", "0.99"]
    assert m["chunks"]["ncu_dram_write_bytes"] > m["warps"]["ncu_dram_write_bytes"]
    # equal halves: fewer warp instructions per element, but the SMs are far from busy
    assert [said(m[v]["ncu_warp_inst_per_element"], 2) for v in ("equal_halves", "accurate")] == \
        ["0.29", "0.38"]
    for v in ("accurate", "equal_halves"):
        print(f"  {v:13s} {m[v]['ncu_warp_inst_per_element']:.2f} warp instructions per "
              f"element, SM throughput {m[v]['ncu_sm_throughput_pct']:.1f} %")
    assert [said(m[v]["ncu_sm_throughput_pct"], 1)
            for v in ("accurate", "equal_halves", "ropelib")] == ["34.3", "28.0", "29.7"]
    # ... and its step net of the chunks rung's loss: over the warps rung, the one before it
    # without the extra writes
    print(f"s4096-b8, points of a copy: rungs 4 and 5 on the warps rung "
          f"{big['accurate'] - big['warps']:+.1f}, equal halves on the warps rung "
          f"{big['equal_halves'] - big['warps']:+.1f}")
    assert [said(big[v] - big["warps"], 1) for v in ("accurate", "equal_halves")] == \
        ["-2.7", "2.8"]

    # b = 1: the 8-warp rung against the 4-warp tile rung (the mechanism CSV has neither the
    # tile rung nor rung 6 at b = 1; the profile after this cell has both)
    m1 = measured.mechanism("s32768-b1")
    b1_rows = {r["provider"]: r for r in rows if r["case"] == "s32768-b1"}
    b1_pct = by_case["s32768-b1"]
    print("s32768-b1: warps rung "
          f"{m1['warps']['ncu_warp_inst_per_element']:.2f} warp instructions per element, SM "
          f"throughput {m1['warps']['ncu_sm_throughput_pct']:.1f} %; chunks rung "
          f"{m1['chunks']['ncu_warp_inst_per_element']:.2f} on grid {m1['chunks']['grid']}, "
          f"{m1['chunks']['num_warps']} warps; profiled here: {sorted(m1)}")
    assert 0.5 < b1_pct["warps"] / b1_pct["tile"] < 0.6                         # over 2/5 lost
    assert "tile" not in m1 and "equal_halves" not in m1           # not in the mechanism CSV
    assert said(m1["warps"]["ncu_warp_inst_per_element"], 2) == "1.85"
    assert said(m1["warps"]["ncu_warp_inst_per_element"]
                / m1["chunks"]["ncu_warp_inst_per_element"], 1) == "7.6"
    assert (b1_rows["chunks"]["num_warps"], b1_rows["chunks"]["block_s"]) == (4, 2)
    assert m1["chunks"]["grid"] == "16384x1x1"

    # the ropelib bar: about the noise below rung 6 with a batch loop, above it at b = 1
    large = ("s4096-b8", "s16384-b8-h8", "s32768-b1")
    below = {case: by_case[case]["equal_halves"] - by_case[case]["ropelib"] for case in large}
    print("ropelib's finished kernel below rung 6, points:",
          {c: round(v, 1) for c, v in below.items()})
    assert [said(below[c], 1) for c in large] == ["1.5", "0.4", "-2.7"]
    rung6, fin = mech["equal_halves"], mech["ropelib"]
    assert fin["kernel"] == "_rope_kernel" and fin["grid"] == rung6["grid"] == "4096x1x1"
    assert fin["num_warps"] == rung6["num_warps"] == 8
    # 7 % more warp instructions per element than rung 6, well under rung 5's (both halves'
    # sin/cos); a per cent more time under the profiler
    assert round(fin["ncu_warp_inst_per_element"]
                 / rung6["ncu_warp_inst_per_element"] - 1, 2) == 0.07
    assert fin["ncu_warp_inst_per_element"] < mech["accurate"]["ncu_warp_inst_per_element"] - 0.05
    assert round(fin["us"] / rung6["us"] - 1, 2) == 0.01
    assert abs(fin["ncu_dram_bytes_over_model"] - rung6["ncu_dram_bytes_over_model"]) < 0.03
    # the load order, timed as two variants of the finished kernel (three alternating rounds,
    # one Python per variant, medians): x first, or the table first
    _, knob_rows = measured.load("finished_kernel_knobs")
    order = {}
    for r in knob_rows:
        if r["pass"] == "forward":
            order.setdefault((r["case"], r["variant"]), []).append(r["ratio_to_copy"])
    order = {key: sorted(v)[len(v) // 2] for key, v in order.items()}
    X_FIRST_VARIANT, TABLE_FIRST_VARIANT = "x first, every tile", "as shipped"   # the CSV's names
    for c in ("bf16 sbhd s4096 b1 (32 MiB)", "bf16 sbhd s1024 b8 (64 MiB)"):
        print(f"finished kernel, forward, ratio to a copy, {c}: x first "
              f"{order[c, X_FIRST_VARIANT]:.3f}, the table first "
              f"{order[c, TABLE_FIRST_VARIANT]:.3f}")
    assert [said(order[c, v])
            for c in ("bf16 sbhd s4096 b1 (32 MiB)", "bf16 sbhd s1024 b8 (64 MiB)")
            for v in (X_FIRST_VARIANT, TABLE_FIRST_VARIANT)] == ["0.931", "0.892", "0.804", "0.835"]
    # the equal-halves step at b = 1, and the profiled rung of the same grid and warps
    assert [said(b1_pct[v], 1) for v in ("accurate", "equal_halves")] == ["85.8", "90.8"]

    # apply_rope as planned: the two-pass route at the three large sizes, the fastest bar there;
    # more occupancy with the same bytes, and more instructions per element
    assert all(by_case[c]["ropelib_planned"] > by_case[c]["ropelib"]
               for c in ("s4096-b8", "s16384-b8-h8")), by_case
    assert abs(by_case["s32768-b1"]["ropelib_planned"] - by_case["s32768-b1"]["ropelib"]) < 1
    assert big["ropelib_planned"] == max(v for k, v in big.items() if k != "copy"), big

    # 16 tokens: chunks and accurate (the same machine code), medians far apart, each call fast
    # or slow
    t16 = measured.timings("ladder", "s16-b64")
    assert said(step["s16384-b8-h8"]["equal_halves"], 1) == "-0.2"
    assert "equal_halves" in hatched["s16384-b8-h8"]
    # the chunks step at h = 8: +0.1 on the warps rung's launch
    h8_rows = {r["provider"]: r for r in rows if r["case"] == "s16384-b8-h8"}
    assert said(step["s16384-b8-h8"]["chunks"], 1) == "0.1"
    h8_launch = {v: (math.prod(int(g) for g in str(h8_rows[v]["grid"]).split("x")),
                     h8_rows[v]["num_warps"], h8_rows[v]["block_s"]) for v in ("warps", "chunks")}
    assert h8_launch["warps"] == h8_launch["chunks"] == (4096, 8, 4), h8_launch
    # ... and the counted writes: rung 6 (the same runtime loop bounds) writes as the warps rung
    written = {v: mech[v]["ncu_dram_write_bytes"] / 1e6 for v in ("equal_halves", "warps",
                                                                  "chunks")}
    assert [said(v, 1) for v in written.values()] == ["246.3", "246.7", "262.8"]
    # ... and the two rungs' stores in sm_90 machine code, compiled here with the H200's plan
    x_meta = torch.empty(4096, 8, 32, 128, dtype=torch.bfloat16, device="meta")
    stores = {}
    try:
        from ropelib.course import load_schedule
        for v in ("warps", "chunks"):
            pv = ladder.plan(v, 4096, 8, 32, 128, 2, SMS_H200, H200_KNOBS)
            a = dict(x_ptr=torch.empty(16, dtype=torch.bfloat16), y_ptr=torch.empty(
                16, dtype=torch.bfloat16), freqs_ptr=torch.empty(16), S=4096, B=8, H=32,
                HALF=64, BLOCK_HALF=64, BLOCK_S=pv.block_s, BLOCK_H=pv.block_h, BF16_RTNE=False,
                **dict(zip([f"stride_{t}{k}" for t in "xy" for k in "sbhd"], 2 * x_meta.stride())),
                stride_fs=128, **(dict(B_CHUNK=pv.chunk, ACCURATE=False) if v == "chunks" else {}))
            sass = load_schedule.schedule(getattr(ladder, ladder.KERNELS[v]), a,
                                          num_warps=pv.num_warps)["sass"]
            stores[v] = [re.sub(r"\s*(/\*.*|;.*)$", "", i).strip() for i in sass if "STG" in i]
    except COMPILE_ERRORS as exc:  # no compiler for this target here: say so
        print(f"compiling for sm_90 did not work here ({type(exc).__name__}: {str(exc)[:300]})")
    if len(stores) == 2:
        print(f"sm_90, Triton {triton.__version__}: the stores of warps {stores['warps']}, "
              f"of chunks {stores['chunks']}")
        # the same stores in the same order: the same opcodes, widths and offsets (which
        # registers hold the address and the data is the register allocator's choice)
        def shape_of(store):
            return re.sub(r"\bR\d+", "R", store)
        assert [shape_of(i) for i in stores["warps"]] == [shape_of(i) for i in stores["chunks"]]
        assert meta["triton"].startswith("3.6")                 # "the H200 run used Triton 3.6"
    assert all(4 < t16[n]["ms_p80"] / t16[n]["ms_p20"] < 5.1
               for n in ("chunks", "accurate"))                # "four to five times that"
    return dict(by_case=by_case, step=step, MECHANISM=MECHANISM)


def stall_profile(mechanism=None):
    """Section 5's cycles profile (`benchmarks/ladder_stalls_ncu.py`, Nsight Compute's warp
    states): prints the derived table per size, checks the prose's numbers, and returns
    {size: {kernel: derived numbers}} with the warp-state table under "states"."""
    STALLS_CSV = measured.RESULTS / "ladder_stalls_ncu-nvidia-h200-20261201-2309.csv"
    STALL_CASES = {"s4096-b8": 4096, "s32768-b1": 32768}        # the profile's sizes: S; b = 8, 1
    STALL_NAMES = ("copy", *ladder.NAMES, "finished")
    stall_kernels = measured.ncu_kernels(STALLS_CSV)
    assert compare.read_meta(STALLS_CSV)["gpu"] == "NVIDIA H200"
    assert [k["kernel"] for k in stall_kernels[:len(STALL_NAMES)]] == [
        "_copy_kernel", "_rope_batch_reuse_kernel", "_ladder_heads_kernel", "_ladder_tile_kernel",
        "_ladder_tile_kernel", "_ladder_chunk_kernel", "_ladder_chunk_kernel",
        "_ladder_final_kernel", "_rope_kernel"]
    LONG_SB = "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"


    def cycles(m, S):
        """The derived numbers of one profiled kernel (metrics m) at S tokens."""
        ns = m["gpu__time_duration.sum"]
        moved = m["dram__bytes_read.sum"] + m["dram__bytes_write.sum"]
        return dict(us=ns / 1e3, tb_s=moved / ns / 1e3, written_mb=m["dram__bytes_write.sum"] / 1e6,
                    inst_m=m["smsp__inst_executed.sum"] / 1e6,
                    issuing=m["smsp__issue_active.avg.per_cycle_active"],
                    occupancy=m["sm__warps_active.avg.pct_of_peak_sustained_active"],
                    waiting_on_memory=m[LONG_SB],
                    sin_cos_copies=m["smsp__inst_executed_pipe_xu.sum"] / (S * 64 * 2 / 32))


    def profile(kernels, case):
        """{name: cycles()} of one size's launches in a profile's kernels (its sizes in order)."""
        first = list(STALL_CASES).index(case) * len(STALL_NAMES)
        return {name: cycles(kernels[first + j]["metrics"], STALL_CASES[case])
                for j, name in enumerate(STALL_NAMES)}


    prof = {case: profile(stall_kernels, case) for case in STALL_CASES}
    print(f"{STALLS_CSV.name}: NVIDIA H200, bf16 sbhd h=32 d=128, Nsight Compute's base clock")
    for case in STALL_CASES:
        print(f"\n{case:10s}{'us':>8s}{'DRAM TB/s':>11s}{'written MB':>12s}{'warp inst M':>13s}"
              f"{'issuing':>9s}{'occupancy':>11s}{'waiting on memory':>19s}{'sin/cos copies':>16s}")
        for name in STALL_NAMES:
            p = prof[case][name]
            copies = (f"{p['sin_cos_copies']:16.0f}" if name in ("heads", "tile", "warps", "chunks",
                                                                 "accurate") else "")
            print(f"  {name:14s}{p['us']:8.1f}"
                  f"{p['tb_s']:11.2f}{p['written_mb']:12.1f}{p['inst_m']:13.1f}"
                  f"{p['issuing']:9.0%}{p['occupancy']:10.1f}%{p['waiting_on_memory']:19.1f}{copies}")


    def r(v, digits=1):
        return round(v, digits)


    b8, b1 = (prof[c] for c in STALL_CASES)
    # b = 8. heads, tile and warps: the same time and DRAM rate while the instructions grow by
    # 45 %, the schedulers issuing in a third to under half of their cycles: memory sets the pace
    assert [r(b8[n]["us"]) for n in ("heads", "tile", "warps")] == [145.4, 146.5, 147.4]
    assert [r(b8[n]["tb_s"], 2) for n in ("heads", "tile", "warps")] == [3.56, 3.53, 3.51]
    assert r(b8["warps"]["inst_m"] / b8["heads"]["inst_m"], 2) == 1.45
    assert [round(100 * b8[n]["issuing"]) for n in ("heads", "warps")] == [32, 46]
    # chunks: the warps rung's DRAM rate and instructions, 16.1 MB more written inside its time,
    # which at that rate is most of its extra time
    extra_mb = b8["chunks"]["written_mb"] - b8["warps"]["written_mb"]
    extra_us = b8["chunks"]["us"] - b8["warps"]["us"]
    writes_us = extra_mb / b8["chunks"]["tb_s"]        # MB / (TB/s) = us
    print(f"\nb = 8, chunks against warps: {extra_us:+.1f} us, {extra_mb:+.1f} MB written, which at "
          f"{b8['chunks']['tb_s']:.2f} TB/s take {writes_us:.1f} us")
    assert [r(b8[n]["tb_s"], 2) for n in ("warps", "chunks")] == [3.51, 3.50]
    assert r(b8["chunks"]["inst_m"] / b8["warps"]["inst_m"] - 1, 2) == 0.03
    assert (r(extra_mb), r(extra_us), r(writes_us)) == (16.1, 5.0, 4.6)
    assert r(prof["s4096-b8"]["copy"]["written_mb"]) == 244.2        # the copy's too fall short
    assert r(4096 * 8 * 32 * 128 * 2 / 1e6) == 268.4                   # ... of its y's 268.4 MB
    # the copy's DRAM rate, 4.11 TB/s at both sizes, the most of any kernel profiled
    assert all(r(p["copy"]["tb_s"], 2) == 4.11 for p in prof.values())
    assert all(p["copy"]["tb_s"] == max(v["tb_s"] for v in p.values()) for p in prof.values())
    # equal halves: the writes back where the warps rung had them, and a faster DRAM rate
    eh, acc = b8["equal_halves"], b8["accurate"]
    at_new_rate = (acc["tb_s"] * acc["us"]) / eh["tb_s"]          # the accurate rung's bytes
    print(f"b = 8, equal halves against accurate: {eh['us'] - acc['us']:+.1f} us; DRAM "
          f"{acc['tb_s']:.2f} -> {eh['tb_s']:.2f} TB/s, written {acc['written_mb']:.1f} -> "
          f"{eh['written_mb']:.1f} MB; the accurate rung's bytes at the new rate: {at_new_rate:.1f} us")
    assert [r(v["tb_s"], 2) for v in (acc, eh)] == [3.49, 3.65]
    assert r(acc["written_mb"] - eh["written_mb"]) == 16.4 and r(eh["written_mb"]) == 246.9
    if mechanism is not None:   # the step table's mechanism column says these writes
        assert f"{r(extra_mb)} MB more reach DRAM" in mechanism["chunks"]
        assert f"{r(acc['written_mb'] - eh['written_mb'])} MB fewer writes" in mechanism["equal_halves"]
        assert f"{r(acc['tb_s'], 2)} -> {r(eh['tb_s'], 2)} TB/s" in mechanism["equal_halves"]
    assert (r(acc["us"] - at_new_rate), r(at_new_rate - eh["us"])) == (6.6, 4.5)
    assert r(acc["us"] - eh["us"]) == 11.1
    assert r(1 - eh["inst_m"] / acc["inst_m"], 2) == 0.24
    assert [round(100 * v["issuing"]) for v in (acc, eh)] == [46, 38]
    assert [r(v["waiting_on_memory"]) for v in (acc, eh)] == [10.7, 14.5]
    # the finished kernel against rung 6: 1.9 us, 4.2 MB more written (1.2 us of it at its rate),
    # 7 % more instructions
    fin8 = b8["finished"]
    assert [r(v["us"]) for v in (fin8, eh)] == [143.7, 141.9]
    assert (r(fin8["us"] - eh["us"]), r(fin8["written_mb"] - eh["written_mb"])) == (1.9, 4.2)
    assert r((fin8["written_mb"] - eh["written_mb"]) / fin8["tb_s"]) == 1.2
    assert r(fin8["inst_m"] / eh["inst_m"] - 1, 2) == 0.07

    # b = 1. heads, tile, warps: bound by issuing; each sin/cos evaluated 16 or 32 times
    assert [round(100 * b1[n]["issuing"]) for n in ("heads", "tile", "warps")] == [80, 79, 74]
    assert [r(b1[n]["sin_cos_copies"]) for n in ("heads", "tile", "warps", "chunks")] == \
        [16, 16, 32, 1]
    assert [r(b1[n]["tb_s"], 2) for n in ("heads", "tile", "warps")] == [2.50, 2.40, 1.25]
    # the tile rung (BLOCK_S = 1 at h = 32, the heads rung's tile in the 3-D form): 3 % more
    # instructions at lower occupancy; instructions over the issue rate predict the time under the
    # profiler
    more_inst = b1["tile"]["inst_m"] / b1["heads"]["inst_m"]
    predicted = more_inst * b1["heads"]["issuing"] / b1["tile"]["issuing"]
    print(f"b = 1, tile against heads: {more_inst:.3f}x the instructions, issuing "
          f"{b1['heads']['issuing']:.0%} -> {b1['tile']['issuing']:.0%}, occupancy "
          f"{b1['heads']['occupancy']:.1f} -> {b1['tile']['occupancy']:.1f} %: predicted "
          f"{predicted:.3f}x the time, measured {b1['tile']['us'] / b1['heads']['us']:.3f}x")
    assert r(more_inst - 1, 2) == 0.03 and [r(b1[n]["occupancy"]) for n in ("heads", "tile")] == \
        [47.3, 41.4]
    assert (r(predicted, 3), r(b1["tile"]["us"] / b1["heads"]["us"], 3)) == (1.043, 1.041)
    # chunks: each sin/cos once, 7.6x fewer instructions than the warps rung; memory-bound from here
    assert r(b1["warps"]["inst_m"] / b1["chunks"]["inst_m"]) == 7.6
    assert [round(100 * b1[n]["issuing"]) for n in ("chunks", "equal_halves", "finished")] == \
        [29, 30, 36]
    assert [r(b1[n]["tb_s"], 2) for n in ("chunks", "equal_halves", "finished", "copy")] == \
        [3.53, 3.69, 3.99, 4.11]
    # x first (the finished kernel at b = 1): fewer warps waiting on memory in an average cycle
    waiting_b1 = {n: b1[n]["waiting_on_memory"] * b1[n]["issuing"] for n in ("equal_halves",
                                                                             "finished")}
    assert [r(waiting_b1[n]) for n in ("equal_halves", "finished")] == [3.3, 2.2]

    # the profiler's base clock against the timed runs (benchmarks/ladder.py's CSV), at b = 1: the
    # heads rung, paced by its instructions, slower under the profiler; the chunks rung about the same
    timed_b1 = {n: t["ms"] * 1e3 for n, t in measured.timings("ladder", "s32768-b1").items()}
    print(f"b = 1, profiled at the base clock against timed: heads {b1['heads']['us']:.1f} against "
          f"{timed_b1['heads']:.1f} us, chunks {b1['chunks']['us']:.1f} against "
          f"{timed_b1['chunks']:.1f} us")
    assert [r(b1[n]["us"]) for n in ("heads", "chunks")] == [214.3, 151.1]
    assert [r(timed_b1[n]) for n in ("heads", "tile", "chunks")] == [175.8, 191.1, 150.1]
    # the same profile at the GPU's own clock (Nsight Compute told to leave it alone): the tile
    # rung's step as the timed runs see it, and the instructions over the issue rate predict it
    FREE_CSV = measured.RESULTS / "ladder_stalls_ncu-nvidia-h200-20261201-2335-clock-none.csv"
    free_kernels = measured.ncu_kernels(FREE_CSV)
    assert "--clock-control none" in compare.read_meta(FREE_CSV)["what"]
    assert [k["kernel"] for k in free_kernels] == [k["kernel"] for k in stall_kernels]
    free = profile(free_kernels, "s32768-b1")
    free_more = free["tile"]["inst_m"] / free["heads"]["inst_m"]
    free_predicted = free_more * free["heads"]["issuing"] / free["tile"]["issuing"]
    print(f"b = 1 at the GPU's own clock, tile against heads: {free['tile']['us']:.1f} against "
          f"{free['heads']['us']:.1f} us, issuing {free['heads']['issuing']:.0%} -> "
          f"{free['tile']['issuing']:.0%}: predicted {free_predicted:.3f}x the time, profiled "
          f"{free['tile']['us'] / free['heads']['us']:.3f}x, timed "
          f"{timed_b1['tile'] / timed_b1['heads']:.3f}x")
    assert [r(free[n]["us"]) for n in ("heads", "tile")] == [173.7, 188.5]
    assert [round(100 * free[n]["issuing"]) for n in ("heads", "tile")] == [77, 73]
    assert (r(free_predicted, 2), r(free["tile"]["us"] / free["heads"]["us"], 2),
            r(timed_b1["tile"] / timed_b1["heads"], 2)) == (1.09, 1.08, 1.09)

    # warps waiting on memory in an average cycle of a scheduler: waiting on memory per
    # instruction issued, times the share of cycles a scheduler issues; resident warps from the
    # achieved occupancy (16 warp slots a scheduler, 4 schedulers an SM on sm_90)
    WARPS_PER_SCHEDULER = 16
    print("\nb = 8, warps a scheduler in an average cycle\n"
          "  kernel        waiting on memory  resident  waiting/resident  DRAM TB/s")
    waiting, resident = {}, {}
    for name in ("copy", "heads", "tile", "warps", "chunks", "accurate", "equal_halves",
                 "finished"):
        m = stall_kernels[STALL_NAMES.index(name)]["metrics"]
        waiting[name] = m[LONG_SB] * m["smsp__issue_active.avg.per_cycle_active"]
        resident[name] = (m["sm__warps_active.avg.pct_of_peak_sustained_active"] / 100
                          * WARPS_PER_SCHEDULER)
        print(f"  {name:14s}{waiting[name]:12.1f}{resident[name]:16.1f}"
              f"{waiting[name] / resident[name]:14.2f}{b8[name]['tb_s']:13.2f}")
    LATER = ("warps", "chunks", "accurate", "equal_halves", "finished")
    assert r(waiting["copy"]) == 10.6
    assert (r(min(waiting[n] for n in LATER)), r(max(waiting[n] for n in LATER))) == (4.9, 5.5)
    assert all(1.8 < waiting["copy"] / waiting[n] < 2.3 for n in LATER)     # "about half"
    # ... and about half its warps resident; the share of resident warps waiting: the copy's at
    # rung 6 and the finished kernel, lower for the three rungs before, at the same occupancy
    assert r(resident["copy"]) == 13.6 and all(r(resident[n]) == 7.1 for n in LATER)
    share = {n: waiting[n] / resident[n] for n in waiting}
    assert all(0.77 < share[n] < 0.79 for n in ("copy", "heads", "equal_halves", "finished"))
    assert all(0.68 < share[n] < 0.70 for n in ("warps", "chunks", "accurate"))
    assert [r(b8[n]["occupancy"]) for n in ("accurate", "equal_halves")] == [44.4, 44.3]
    assert (r(min(b8[n]["tb_s"] for n in LATER), 2), r(max(b8[n]["tb_s"] for n in LATER), 2)) == \
        (3.49, 3.65)

    # every warp state (Nsight Compute's 18), as warps a scheduler in an average cycle: they sum,
    # within 2 %, to the resident warps. From rung 5 to rung 6, at the same residency, the warps leave the
    # other states for long_scoreboard (waiting on a load)
    STATE, ISSUE = "smsp__average_warps_issue_stalled_", "smsp__issue_active.avg.per_cycle_active"
    STATE_KERNELS = ("heads", "warps", "accurate", "equal_halves", "finished")
    states = {}
    for name in STATE_KERNELS:
        m = stall_kernels[STALL_NAMES.index(name)]["metrics"]
        states[name] = {k[len(STATE):-len("_per_issue_active.ratio")]: m[k] * m[ISSUE]
                        for k in m if k.startswith(STATE)}
    SHOWN_STATES = ("long_scoreboard", "no_instruction", "not_selected", "selected", "wait",
                    "math_pipe_throttle", "branch_resolving")
    print("\nb = 8, warp states: warps a scheduler in an average cycle\n  "
          + f"{'state':20s}" + "".join(f"{n:>14s}" for n in STATE_KERNELS))
    for st in SHOWN_STATES:
        print(f"  {st:20s}" + "".join(f"{states[n][st]:14.2f}" for n in STATE_KERNELS))
    other = {n: sum(v for k, v in states[n].items() if k not in SHOWN_STATES)
             for n in STATE_KERNELS}
    print(f"  {'the other 11':20s}" + "".join(f"{other[n]:14.2f}" for n in STATE_KERNELS))
    print(f"  {'all 18':20s}" + "".join(f"{sum(states[n].values()):14.2f}" for n in STATE_KERNELS))
    print(f"  {'resident':20s}" + "".join(f"{resident[n]:14.2f}" for n in STATE_KERNELS))
    assert all(len(states[n]) == 18 for n in STATE_KERNELS)
    assert all(abs(sum(states[n].values()) / resident[n] - 1) < 0.02 for n in STATE_KERNELS)
    acc_st, eh_st = states["accurate"], states["equal_halves"]
    delta = {st: eh_st[st] - acc_st[st] for st in acc_st}
    print("rung 5 -> rung 6: " + ", ".join(f"{st} {acc_st[st]:.2f} -> {eh_st[st]:.2f}"
                                            for st in SHOWN_STATES))
    # the prose: long_scoreboard 4.90 -> 5.50 (+0.60); the others fall
    assert [r(v, 2) for v in (acc_st["long_scoreboard"], eh_st["long_scoreboard"])] == [4.90, 5.50]
    assert r(delta["long_scoreboard"], 2) == 0.60
    assert [(r(acc_st[st], 2), r(eh_st[st], 2)) for st in ("no_instruction", "not_selected",
                                                            "selected", "wait")] == \
        [(0.35, 0.11), (0.53, 0.36), (0.46, 0.38), (0.43, 0.37)]
    assert all(delta[st] < 0 for st in SHOWN_STATES[1:])
    assert abs(sum(delta.values())) < 0.1                        # the same residency
    # heads -> warps: more resident warps, the same warps on loads (4.93 -> 4.94)
    assert [r(states[n]["long_scoreboard"], 2) for n in ("heads", "warps")] == [4.93, 4.94]
    assert [r(resident[n], 1) for n in ("heads", "warps")] == [6.4, 7.1]
    return dict(prof=prof, waiting=waiting, resident=resident, states=states)


def torch_compile_runs(main_ratio):
    """torch.compile of Hugging Face's formula at bf16 sbhd s16k b8 (1 GiB), forward, in every
    committed H200 run that times it (`main_ratio`: the two_pass table's): prints each ratio to
    a copy and returns (lowest, highest)."""
    one_gib = "sbhd 1 GiB s16k b8"
    runs = {"two_pass (main table)": main_ratio}
    for run in ("-20261202-0822", "-20261202-1443", "-20261202-1747"):
        runs[f"half_rows_probe{run}"] = measured.two_pass(
            measured.GPU + run, kind="half_rows_probe")[(one_gib, "forward")]["torch.compile"][
            "ratio_to_copy"]
    runs["flat_pass_probe"] = measured.probe("flat_pass_probe")[
        "bf16 " + one_gib]["torch.compile, bfloat16 table"]["ratio_to_copy"]
    runs["flat_hints_probe"] = measured.probe("flat_hints_probe")[
        "bf16 " + one_gib]["torch.compile"]["ratio_to_copy"]
    runs["paired_rows_probe"] = measured.probe("paired_rows_probe")[
        "bf16 " + one_gib]["torch.compile (16-bit table)"]["ratio_to_copy"]
    print("torch.compile, 1 GiB forward, ratio to a copy, by run: "
          + ", ".join(f"{k} {v:.3f}" for k, v in runs.items()))
    lo, hi = min(runs.values()), max(runs.values())
    print(f"  from {lo:.3f} to {hi:.3f}: {100 * (hi - lo):.1f} points between runs")
    assert len(runs) == 7 and 3.5 < 100 * (hi - lo) < 4.5         # "up to about four points"
    return lo, hi


def check_wide_stores(name: str, kernel, args: dict, *, num_warps: int, wide: int) -> bool:
    """Exercise 1b's second condition, after its loads: the stores. A stride-2 store writes half
    of every 32-byte sector it touches, so the exercise wants no 2-byte global store and at
    least `wide` of 16 bytes, in the kernel compiled for sm_90 with `args` as a launch would
    pass them. Prints one line and returns the verdict; never raises."""
    from ropelib.course import load_schedule
    from ropelib.course.exercises import is_blank_kernel, is_kernel
    if not is_kernel(kernel) or is_blank_kernel(kernel):
        print(f"❌ {name}: write the kernel first: its stores are counted after its loads")
        return False
    sched = load_schedule.compiled_for_grading(name, kernel, args, num_warps=num_warps)
    if sched is None:
        return False
    widths = load_schedule.store_widths(sched)
    found = ", ".join(f"{n} of {b} byte{'s' if b > 1 else ''}" for b, n in widths.items())
    if widths.get(2, 0) or widths.get(1, 0) or widths.get(16, 0) < wide:
        print(f"❌ {name}: a thread's global stores, sm_90: {found or 'none'}. Wanted: no 2-byte "
              f"stores and at least {wide} of 16 bytes: put each pair back in registers "
              "(tl.join, tl.reshape) and store whole rows")
        return False
    print(f"✅ {name}: a thread's global stores, sm_90: {found}")
    return True


# Exercise 1's timing on a GPU (the notebook's `time_exercise_1` calls these)
def time_against_copy(x, y, want, yours, solution, others=()):
    """Time y.copy_(x), each of your launches (yours: name -> (passed its check, a call that
    writes y)), the worked solution's (a call that writes y) and `others` ((name, call) pairs)
    with do_bench; print each median and its speed as a fraction of the copy's, and return those
    fractions by name. Yours are timed only once they pass their check, and only after their
    output at this size is asserted to be `want` (the reference); a solution of None is not
    timed."""
    from triton.testing import do_bench

    from ropelib import runtime
    mode = runtime.mode()
    print(f"x {list(x.shape)} {str(x.dtype).replace('torch.', '')} "
          f"({x.numel() * x.element_size() >> 20} MiB), {mode}: median us "
          "(20-80 % quantiles), speed as a fraction of the copy's")
    timed = {}
    for name, (passed, run) in yours.items():
        if not passed:
            print(f"  {name}: timed here once it passes its check above")
            continue
        y.fill_(float("nan"))                  # an element the kernel does not write stays NaN
        run()
        torch.testing.assert_close(                # correct at this size too
            y, want, msg=lambda m, name=name: f"{name}, x {list(x.shape)}: {m}")
        timed[name] = run
    if solution is not None:
        timed["worked solution"] = solution
    timed.update(others)
    copy_ms = do_bench(lambda: y.copy_(x), quantiles=[0.5, 0.2, 0.8])
    ratios = {}
    for name, run in {"y.copy_(x)": None, **timed}.items():
        ms = copy_ms if run is None else do_bench(run, quantiles=[0.5, 0.2, 0.8])
        ratios[name] = copy_ms[0] / ms[0]
        print(f"  {name:26s} {ms[0] * 1e3:7.1f} us ({ms[1] * 1e3:.1f}-{ms[2] * 1e3:.1f})  "
              f"{ratios[name]:.2f} of a copy")
    return ratios


def against_committed(live, committed, band=0.15):
    """Print each live ratio to a copy beside the committed run's for the same shape, and
    assert it lies within `band` (a fraction) of it: another GPU, driver or day moves a ratio
    by a few per cent, not by a sixth."""
    for name, (was, where) in committed.items():
        print(f"  {name:26s} live {live[name]:.3f} of a copy; committed {was:.3f} ({where})")
        assert abs(live[name] / was - 1) <= band, \
            f"{name}: {live[name]:.3f} of a copy here, {was:.3f} committed: more than " \
            f"{band:.0%} apart"
