"""Notebook 05's checks on the committed H200 measurements, out of the learner's way.

Each function prints the table a passage of `notebooks/05-finished-kernel.py` reads and asserts
every number that passage states, so a changed CSV or a changed sentence fails loudly
(AssertionError) instead of leaving the prose wrong; the notebook calls it in the code cell right
after the markdown cell it checks. They read only committed files under `benchmarks/results/`
(and, where they say so, compile for sm_90 on this machine), so they run on a CPU.

Section 5: `steps_table` (the table of what each rung buys), `one_run_steps` and `sixteen_tokens`
(the paragraphs after it), `table_probe` (the sin/cos's share of the gap); appendix A.1:
`heads_one_change_at_a_time`, `one_run_writes`, `load_order`; A.2: `stall_details`; A.3:
`opcode_profile`; A.9: `paired_rows_probe`, `elementwise_route`. The appendices' longer helpers
live here too, each saying what it does: the finished kernel's launch compiled for sm_90
(`finished_schedule`), ropelib's flat pass compiled the same way (`flat_pass_schedule`), one
angle's share of libdevice's sin/cos slow path (`slow_path_share`). So do the notebook's shared
helpers: section 3's timing of the rungs as the notebook launches them (`time_rungs`), the
exercises' timing (`time_against_copy`) and the one line every cell prints when compiling for sm_90
fails here (`compile_failed`).
`tests/test_nb05_checks.py` runs them.
"""
import math
import re

import torch
import triton
import triton.language as tl

from ropelib.bench import compare
from ropelib.course import ladder, measured


# section 5's cycles profile (benchmarks/ladder_stalls_ncu.py, Nsight Compute's warp states)
STALLS_CSV = measured.RESULTS / "ladder_stalls_ncu-nvidia-h200-20261201-2309.csv"
STALL_NAMES = ("copy", *ladder.NAMES, "finished")    # each size's launches, in the profile's order
LONG_SB = "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"


def said(v, digits=3):
    """A number as the prose writes it."""
    return f"{v:.{digits}f}"


def r(v, digits=1):
    return round(v, digits)


def ladder_pct(rows):
    """{case: {provider: % of a copy}} of the ladder run's timed rows (`rows` as
    nb05_waterfall.read gives them: the copy's median time over the kernel's)."""
    by_case = {}
    for row in rows:
        if row.get("pct_of_copy") is not None:
            by_case.setdefault(row["case"], {})[row["provider"]] = row["pct_of_copy"]
    return by_case


def ladder_steps(by_case):
    """{case: {rung: its step from the rung before, in points of a copy}} (ladder.NAMES)."""
    return {case: {b: pct[b] - pct[a] for a, b in zip(ladder.NAMES, ladder.NAMES[1:])}
            for case, pct in by_case.items()}


def _profiled(case):
    """The cycles profile (STALLS_CSV) at one size: {launch name: Nsight Compute's metrics}."""
    kernels = measured.ncu_kernels(STALLS_CSV)
    first = ("s4096-b8", "s32768-b1").index(case) * len(STALL_NAMES)
    return {name: kernels[first + j]["metrics"] for j, name in enumerate(STALL_NAMES)}


def _sin_cos_copies(m, S):
    """XU instructions (one float-to-int conversion a libdevice sin or cos) over S tokens x 64
    features x 2 / 32 threads."""
    return m["smsp__inst_executed_pipe_xu.sum"] / (S * 64 * 2 / 32)


# What the profiles say of each step: the long form of the "what changed" column of section 5's
# table. Appendix A.2 prints it and asserts its numbers on the cycles profile
# (`stall_details`).
STEP_MECHANISM = {
    "heads": "work per program (notebook 04's variants, A.1)",
    "tile": "b = 8: no step; b = 1 (BLOCK_S = 1): 3 % more instructions, lower occupancy",
    "warps": "b = 8: level; b = 1: each sin/cos evaluated 32 times, not 16",
    "chunks": "b = 1 (the planner's new tile): each sin/cos once; b = 8 (the same "
              "launch): 16.1 MB more reach DRAM in its time",
    "accurate": "none: the chunks rung's launch and machine code (Triton 3.6)",
    "equal_halves": "DRAM rate 3.49 -> 3.65 TB/s, 16.4 MB fewer writes in its time; "
                    "0.6 more warps a scheduler waiting on loads"}


def steps_table(rows, meta, runs, mech, mech_meta, sms, knobs):
    """Section 5's table "What each rung buys", row by row, and the paragraph above it: the
    H200 run's steps (`rows`, `meta`: the ladder run as nb05_waterfall.read gives it), the ten
    H100 processes' medians (`runs`: the ladder_runs rows) and the profiles the last column
    reads (`mech`, `mech_meta`: the mechanism CSV at s4096-b8; the cycles profile, read here),
    with the H200's plans from `sms` SMs and tile `knobs`. Prints the profiled rungs and asserts
    every number and claim of the table."""
    import statistics
    by_case, by_run = ladder_pct(rows), ladder.steps_by_run(runs)
    step = ladder_steps(by_case)
    med = {k: statistics.median(v) for k, v in by_run.items()}
    held = {k for k, v in by_run.items() if ladder.settled(v)}
    c8, c1, c16, h8 = "s4096-b8", "s32768-b1", "s16-b64", "s16384-b8-h8"
    large = (c8, h8, c1)
    m1 = measured.mechanism(c1)
    b1_prof = _profiled(c1)
    from ropelib.course import nb05_waterfall
    changed = nb05_waterfall.launch_changes(rows)     # {size: {rung: what its step changed}}
    assert mech_meta["date"][:10] == meta["date"][:10]    # profiled the same day as timed
    print(f"Nsight Compute on {measured.where(mech_meta)}, s=4096 b=8: each rung")
    print(measured.table([mech[n] for n in ladder.NAMES if n in mech] + [
        {**mech["ropelib"], "variant": "finished kernel (forced)"},
        {**mech["ropelib_planned"], "variant": "apply_rope (two passes)"}], [
        ("rung", "variant", ""), ("us", "us", ".0f"), ("programs", "programs", ","),
        ("warps", "num_warps", "d"), ("occ. %", "ncu_achieved_occupancy_pct", ".0f"),
        ("warp inst/elem", "ncu_warp_inst_per_element", ".2f"),
        ("SM thr. %", "ncu_sm_throughput_pct", ".1f"),
        ("x KiB/SM bound", "x_kib_per_sm", ".1f"),
        ("DRAM/model", "ncu_dram_bytes_over_model", ".3f")]))
    print(f"s=32768 b=1: warps rung {m1['warps']['ncu_warp_inst_per_element']:.2f} warp "
          f"instructions per element, SM throughput {m1['warps']['ncu_sm_throughput_pct']:.1f} %; "
          f"chunks rung {m1['chunks']['ncu_warp_inst_per_element']:.2f} on grid "
          f"{m1['chunks']['grid']}, {m1['chunks']['num_warps']} warps")

    # the paragraph: at b = 1 every step that changes the launch or the code holds in every H100
    # process, with the H200 run's sign; at 16 tokens all but the tile and accurate steps hold in
    # every H100 process, all with the H200 run's sign but chunks (H200 -4.1, H100 median +45.4);
    # at s = 4096, b = 8 no H100 step moves by more than 0.6 points between processes
    assert {n for (c, n) in held if c == c1} == set(ladder.STEP_NAMES) - {"accurate"}
    assert all((med[c1, n] > 0) == (step[c1][n] > 0) for n in ladder.NAMES[1:] if n != "accurate")
    assert {n for (c, n) in held if c == c16} == {"heads", "warps", "chunks", "equal_halves",
                                                  "ropelib"}
    step16 = {**step[c16], "ropelib": by_case[c16]["ropelib"] - by_case[c16]["equal_halves"]}
    assert [n for n in ("heads", "warps", "chunks", "equal_halves", "ropelib")
            if (med[c16, n] > 0) != (step16[n] > 0)] == ["chunks"]
    assert [said(v, 1) for v in (step16["chunks"], med[c16, "chunks"])] == ["-4.1", "45.4"]
    widest_b8 = max(max(v) - min(v) for (c, _), v in by_run.items() if c == c8)
    assert said(widest_b8, 1) == "0.6"
    assert {n for (c, n) in held if c == c8} == {"heads", "warps"}
    # "the GPUs run different tiles": the H100's warps rung has 16 warps, the H200's 8
    warps_h100 = {r["provider"]: r["num_warps"] for r in runs if r["case"] == c1 and r["run"] == 1}
    assert (warps_h100["tile"], warps_h100["warps"], warps_h100["chunks"]) == (4, 16, 4)
    assert [r["num_warps"] for r in rows if r["case"] == c1 and r["provider"] == "warps"] == [8]

    # tile of heads: the big step at every size but 16 tokens; b = 1 from about a fifth of a
    # copy to about three quarters; 32 times fewer programs, about half the warp instructions
    # per element, over six times the x asked for per SM (the mechanism CSV, s4096-b8)
    for case, pct in by_case.items():
        if case != c16:
            assert max(step[case], key=step[case].get) == "heads", (case, step[case])
            assert pct["ropelib"] > pct["batch_reuse"] + 10, (case, pct)
    assert said(step[c8]["heads"], 1) == "16.5"
    assert said(med[c8, "heads"], 1) == "12.2" and (c8, "heads") in held
    assert [said(v, 1) for v in (step[c1]["heads"], med[c1, "heads"])] == ["53.3", "58.6"]
    assert by_case[c1]["batch_reuse"] < 25 and 70 < by_case[c1]["heads"] < 80
    assert by_case[c1]["batch_reuse"] < 30 and by_case[c1]["heads"] > 65
    br_h, heads_h = mech["batch_reuse"], mech["heads"]
    assert br_h["programs"] == 32 * heads_h["programs"]
    assert round(heads_h["ncu_warp_inst_per_element"] / br_h["ncu_warp_inst_per_element"], 1) \
        == 0.5
    assert 6 < heads_h["x_kib_per_sm"] / br_h["x_kib_per_sm"] < 7

    # tile (the 3-D form): nothing at b = 8 (32 heads or 8), a loss at b = 1 on the same launch
    # as the heads rung (at h = 32 the tile rung's BLOCK_S is 1), with 3 % more instructions
    assert all(abs(step[c]["tile"]) < 0.5 for c in (c8, h8))
    assert [said(step[c]["tile"], 1) for c in (c8, h8, c1)] == ["-0.1", "-0.3", "-5.9"]
    assert [said(med[c, "tile"], 1) for c in (c8, c1)] == ["-0.0", "-6.6"]
    assert [said(by_case[c1][n], 1) for n in ("heads", "tile")] == ["73.6", "67.7"]
    assert said(by_case[h8]["heads"], 1) == "91.7"
    h8_heads = ladder.plan("heads", 16384, 8, 8, 128, 2, sms, knobs)
    h8_tile = ladder.plan("tile", 16384, 8, 8, 128, 2, sms, knobs)
    b1_heads = ladder.plan("heads", 32768, 1, 32, 128, 2, sms, knobs)
    b1_tile = ladder.plan("tile", 32768, 1, 32, 128, 2, sms, knobs)
    assert math.prod(h8_heads.grid) == 16384 and h8_heads.block_s == 1
    assert (math.prod(h8_tile.grid), h8_tile.block_s, h8_tile.block_h) == (4096, 4, 8)
    assert (b1_heads.grid, b1_heads.num_warps) == (b1_tile.grid, b1_tile.num_warps)
    assert (b1_tile.block_s, b1_tile.block_h) == (1, b1_heads.block_h) == (1, 32)
    more_inst = b1_prof["tile"]["smsp__inst_executed.sum"] / b1_prof["heads"]["smsp__inst_executed.sum"]
    assert r(more_inst - 1, 2) == 0.03

    # warps: level within the spread at b = 8 (under 2 points), a loss at b = 1 of over two
    # fifths, where each sin/cos is evaluated by 32 threads instead of 16
    assert [said(step[c]["warps"], 1) for c in (c8, c1)] == ["1.8", "-29.6"]
    assert [said(med[c, "warps"], 1) for c in (c8, c1)] == ["2.8", "-16.1"]
    assert abs(step[c8]["warps"]) < 2
    assert 0.5 < by_case[c1]["warps"] / by_case[c1]["tile"] < 0.6
    assert [round(_sin_cos_copies(b1_prof[n], 32768)) for n in ("tile", "warps")] == [16, 32]
    assert "tile" not in m1 and "equal_halves" not in m1          # not in the mechanism CSV
    assert said(m1["warps"]["ncu_warp_inst_per_element"], 2) == "1.85"

    # chunks: at b = 8 the loop bounds only; at b = 1 the planner's new tile (2 tokens on 4
    # warps), which evaluates each sin/cos once, with 7.6 times fewer instructions
    assert [said(step[c]["chunks"], 1) for c in (c8, c1)] == ["-3.0", "48.1"]
    assert [said(med[c, "chunks"], 1) for c in (c8, c1)] == ["-0.0", "29.0"]
    assert changed[c8]["chunks"] == changed[h8]["chunks"] == "same launch, loop bounds"
    assert changed[c1]["chunks"] == "tile 2x32, 4 warps"       # from 1x32 on 8 warps
    b1_rows = {row["provider"]: row for row in rows if row["case"] == c1}
    assert (b1_rows["chunks"]["num_warps"], b1_rows["chunks"]["block_s"]) == (4, 2)
    assert m1["chunks"]["grid"] == "16384x1x1"
    assert said(m1["warps"]["ncu_warp_inst_per_element"]
                / m1["chunks"]["ncu_warp_inst_per_element"], 1) == "7.6"
    assert round(_sin_cos_copies(b1_prof["chunks"], 32768)) == 1

    # accurate: noise at the three large sizes; the same launch and, with the H200 run's
    # Triton 3.6, the chunks rung's machine code (A.3)
    assert all(abs(step[c]["accurate"]) < 0.5 for c in large)
    assert {changed[c]["accurate"] for c in changed} == {"same launch, same code"}
    assert meta["triton"].startswith("3.6")
    assert [said(med[c, "accurate"], 1) for c in (c8, c1)] == ["0.0", "0.1"]
    assert not any(n == "accurate" for (_, n) in held)

    # equal halves: fewer warp instructions per element, which pay at b = 1; at b = 8 the SMs
    # are far from busy
    assert [said(step[c]["equal_halves"], 1) for c in (c8, c1)] == ["5.5", "4.9"]
    assert [said(med[c, "equal_halves"], 1) for c in (c8, c1)] == ["0.3", "1.5"]
    assert (c1, "equal_halves") in held
    assert [said(mech[v]["ncu_warp_inst_per_element"], 2) for v in ("equal_halves", "accurate")] \
        == ["0.29", "0.38"]
    assert [said(mech[v]["ncu_sm_throughput_pct"], 1)
            for v in ("accurate", "equal_halves", "ropelib")] == ["34.3", "28.0", "29.7"]
    assert [said(by_case[c1][v], 1) for v in ("accurate", "equal_halves")] == ["85.8", "90.8"]
    assert b1_prof["equal_halves"]["smsp__inst_executed.sum"] \
        < b1_prof["accurate"]["smsp__inst_executed.sum"]

    # the finished kernel: about the noise below rung 6 with a batch loop, above it at b = 1
    # (x loaded first, A.1); 7 % more warp instructions per element than rung 6 (well under
    # rung 5's), a per cent more time under the profiler, the same grid, warps and bytes
    below = {case: by_case[case]["equal_halves"] - by_case[case]["ropelib"] for case in large}
    print("the finished kernel below rung 6, points of a copy:",
          {c: round(v, 1) for c, v in below.items()})
    assert [said(below[c], 1) for c in large] == ["1.5", "0.4", "-2.7"]
    assert [said(med[c, "ropelib"], 1) for c in (c8, c1)] == ["-0.2", "0.9"]
    rung6, fin = mech["equal_halves"], mech["ropelib"]
    assert fin["kernel"] == "_rope_kernel" and fin["grid"] == rung6["grid"] == "4096x1x1"
    assert fin["num_warps"] == rung6["num_warps"] == 8
    assert round(fin["ncu_warp_inst_per_element"]
                 / rung6["ncu_warp_inst_per_element"] - 1, 2) == 0.07
    assert fin["ncu_warp_inst_per_element"] < mech["accurate"]["ncu_warp_inst_per_element"] - 0.05
    assert round(fin["us"] / rung6["us"] - 1, 2) == 0.01
    assert abs(fin["ncu_dram_bytes_over_model"] - rung6["ncu_dram_bytes_over_model"]) < 0.03
    return step


def one_run_steps(rows, runs):
    """Section 5, the paragraph after the table: the H200's b = 8 steps of the chunks and
    equal-halves rungs lie outside twice the spread of that run's calls, yet the H100
    processes give neither; measured from the warps rung. Prints the spread and the steps,
    asserts the numbers the paragraph states."""
    import statistics
    by_case, by_run = ladder_pct(rows), ladder.steps_by_run(runs)
    big = by_case["s4096-b8"]
    # how well the run measured the rungs compared here: the width of their 20-80 %
    # quantiles, as % of the median
    spread = max((row["ms_p80"] - row["ms_p20"]) / row["ms"] * 100 for row in rows
                 if row["case"] == "s4096-b8" and row["provider"] in
                 ("warps", "chunks", "accurate", "equal_halves", "ropelib"))
    chunk_step, halves_step = big["chunks"] - big["warps"], big["equal_halves"] - big["accurate"]
    print(f"s4096-b8: 20-80 % quantiles at most {spread:.1f} % of the median apart; chunks "
          f"{chunk_step:+.1f} points, equal halves {halves_step:+.1f} points; from the warps "
          f"rung: rungs 4 and 5 {big['accurate'] - big['warps']:+.1f}, rung 6 "
          f"{big['equal_halves'] - big['warps']:+.1f}")
    assert said(spread, 1) == "1.2" and chunk_step < -2 * spread and halves_step > 2 * spread
    assert (said(chunk_step, 1), said(halves_step, 1)) == ("-3.0", "5.5")
    assert (round(-chunk_step), round(halves_step)) == (3, 5)
    med = {n: statistics.median(by_run["s4096-b8", n]) for n in ("chunks", "equal_halves")}
    assert [said(med[n], 1) for n in ("chunks", "equal_halves")] == ["-0.0", "0.3"]
    # net of the chunks rung's loss: from the warps rung, the one before it without the
    # extra writes (A.1)
    assert [said(big[v] - big["warps"], 1) for v in ("accurate", "equal_halves")] == \
        ["-2.7", "2.8"]


def sixteen_tokens(rows, hatched):
    """Section 5, the 16-token panel (s16-b64, a decoding step): from the chunks rung on, the
    H200 run's calls fall into a fast and a slow population. Prints each rung's 20 % quantile,
    median and 80 % quantile, asserts what the paragraph states."""
    by_case = ladder_pct(rows)
    step = ladder_steps(by_case)["s16-b64"]
    t16 = measured.timings("ladder", "s16-b64")
    q16 = {n: {k: 1e3 * t16[n][k] for k in ("ms_p20", "ms", "ms_p80")}
           for n in ("warps", "chunks", "accurate", "equal_halves")}
    print("s16-b64, µs (20 % quantile, median, 80 % quantile): "
          + "; ".join(f"{n} {v['ms_p20']:.1f}, {v['ms']:.1f}, {v['ms_p80']:.1f}"
                      for n, v in q16.items()))
    assert hatched["s16-b64"][-3:] == ["chunks", "accurate", "equal_halves"]
    from ropelib.course import nb05_waterfall
    # from the chunks rung on: 4 warps and one batch entry a program (from one chunk of 64 on 8)
    assert nb05_waterfall.launch_changes(rows)["s16-b64"]["chunks"] == "4 warps, B_CHUNK 1"
    # the warps rung's calls: a narrow range; the chunks rung's fastest fifth three times faster
    assert [said(q16["warps"][k], 1) for k in ("ms_p20", "ms_p80")] == ["40.7", "41.9"]
    assert [said(q16["chunks"][k], 1) for k in ("ms_p20", "ms")] == ["13.2", "51.5"]
    assert round(q16["warps"]["ms_p20"] / q16["chunks"]["ms_p20"]) == 3   # a fast population
    assert q16["chunks"]["ms"] > q16["warps"]["ms_p80"]     # its median: among the slow calls
    assert all(4 < t16[n]["ms_p80"] / t16[n]["ms_p20"] < 5.1 for n in ("chunks", "accurate"))
    # ... and the accurate rung, the chunks rung's launch and code, "gains" 35.6 points
    assert said(step["accurate"], 1) == "35.6"


# --- appendix A.1: four steps, one profile each ----------------------------------------------

HEADS_STEP = ("batch_reuse", "sh_loop_b_w2", "sh_loop_b_table", "heads2_loop_b",
              "heads4_loop_b", "heads8_loop_b_w2", "heads", "equal_halves", "ropelib")


def heads_one_change_at_a_time(mech, named):
    """A.1, the tile of heads one change at a time: notebook 04's variants profiled at
    s4096-b8 (`mech`; `named` labels a row as the notebook's tables do), printed, every
    number of the paragraph asserted."""
    print(measured.table([named(mech[v]) for v in HEADS_STEP], [
        ("variant", "variant", ""), ("us", "us", ".1f"), ("programs", "programs", ","),
        ("warps", "num_warps", "d"), ("x B/warp/step", "x_bytes_per_warp_step", ".0f"),
        ("occ. %", "ncu_achieved_occupancy_pct", ".0f"),
        ("warp inst/elem", "ncu_warp_inst_per_element", ".2f")]))
    hs = {v: mech[v] for v in HEADS_STEP}
    assert [said(hs[v]["us"], 1) for v in HEADS_STEP] == [
        "179.1", "178.1", "169.9", "147.6", "137.2", "136.3", "142.2", "137.2", "138.6"]
    # 2 warps on the batch-reusing grid: the same programs, 128 bytes of x a warp, occupancy
    # 48 -> 94 %, no faster
    assert hs["sh_loop_b_w2"]["programs"] == hs["batch_reuse"]["programs"] == 131072
    assert hs["sh_loop_b_w2"]["x_bytes_per_warp_step"] == 128
    assert [round(hs[v]["ncu_achieved_occupancy_pct"]) for v in
            ("batch_reuse", "sh_loop_b_w2", "heads4_loop_b", "heads8_loop_b_w2")] == \
        [48, 94, 92, 51]
    # the angles from a table instead of sin/cos: 0.51 -> 0.31 warp instructions an element,
    # about 9 µs
    assert [said(hs[v]["ncu_warp_inst_per_element"], 2) for v in
            ("batch_reuse", "sh_loop_b_table")] == ["0.51", "0.31"]
    assert round(hs["batch_reuse"]["us"] - hs["sh_loop_b_table"]["us"]) == 9
    assert (hs["heads2_loop_b"]["programs"], hs["heads2_loop_b"]["num_warps"]) == (65536, 1)
    assert hs["heads4_loop_b"]["num_warps"] == hs["heads8_loop_b_w2"]["num_warps"] == 2
    # four heads on 2 warps: level with rung 6 and the finished kernel, ahead of the heads rung
    assert abs(hs["heads4_loop_b"]["us"] - hs["equal_halves"]["us"]) < 0.01 * hs["ropelib"]["us"]
    assert hs["heads4_loop_b"]["us"] < hs["ropelib"]["us"] < hs["heads"]["us"]
    # one, two, four heads a program: faster each time; eight or 32: no faster than four
    assert hs["batch_reuse"]["us"] > hs["heads2_loop_b"]["us"] > hs["heads4_loop_b"]["us"]
    assert min(hs[v]["us"] for v in ("heads8_loop_b_w2", "heads")) > \
        0.99 * hs["heads4_loop_b"]["us"]
    # eight heads a program on 1, 2, 4, 8 warps: times and achieved occupancy
    h8_warps = [f"heads8_loop_b_w{w}" for w in (1, 2, 4, 8)]
    print("eight heads a program on 1, 2, 4, 8 warps: "
          + ", ".join(f"{mech[v]['us']:.1f} us at {mech[v]['ncu_achieved_occupancy_pct']:.0f} %"
                      for v in h8_warps))
    assert [said(mech[v]["us"], 1) for v in h8_warps] == ["138.1", "136.3", "139.6", "146.8"]
    assert [round(mech[v]["ncu_achieved_occupancy_pct"]) for v in h8_warps] == [29, 51, 68, 87]
    assert max(h8_warps, key=lambda v: mech[v]["us"]) == max(
        h8_warps, key=lambda v: mech[v]["ncu_achieved_occupancy_pct"])    # the most occupied


def one_run_writes(mech, meta, sms, knobs, compile_errors):
    """A.1, the H200 run's chunks and equal-halves steps at b = 8: the same programs, reads and
    instructions, and the DRAM writes the profilers count (`mech`: the mechanism CSV at
    s4096-b8; the cycles profile, read here), with the two rungs' stores compiled for sm_90
    with the H200's plan (`sms`, `knobs`; `compile_errors`: what a missing compiler raises);
    printed, every number of the paragraph asserted. `meta`: the ladder run's header."""
    m, MB = mech, 1e6
    for v in ("warps", "chunks", "accurate", "equal_halves"):
        print(f"  {v:13s} DRAM read {m[v]['ncu_dram_read_bytes'] / MB:6.1f} MB, written "
              f"{m[v]['ncu_dram_write_bytes'] / MB:6.1f} MB: "
              f"{m[v]['ncu_dram_bytes_over_model']:.3f} of the model")
    # chunks: the same programs, about the same instructions, the same DRAM reads; the writes
    # counted differ (the difference printed below)
    assert m["chunks"]["programs"] == m["warps"]["programs"]
    assert abs(m["chunks"]["ncu_warp_inst_per_element"]
               - m["warps"]["ncu_warp_inst_per_element"]) < 0.02
    assert abs(m["chunks"]["ncu_dram_read_bytes"] / m["warps"]["ncu_dram_read_bytes"] - 1) < 2e-4
    assert [said(m[v]["ncu_dram_bytes_over_model"], 2) for v in ("warps", "chunks")] == \
        ["0.96", "0.99"]
    assert m["chunks"]["ncu_dram_write_bytes"] > m["warps"]["ncu_dram_write_bytes"]
    written = {v: m[v]["ncu_dram_write_bytes"] / MB for v in ("equal_halves", "warps", "chunks")}
    assert [said(v, 1) for v in written.values()] == ["246.3", "246.7", "262.8"]
    # ... and in the cycles profile (section 5): more for chunks than warps, fewer for equal
    # halves than rung 5 (rung 6 has the chunks rung's runtime loop bounds)
    prof = _profiled("s4096-b8")
    w = {n: prof[n]["dram__bytes_write.sum"] / MB for n in ("warps", "chunks", "accurate",
                                                           "equal_halves")}
    print(f"the cycles profile, MB written: " + ", ".join(f"{n} {v:.1f}" for n, v in w.items()))
    # the differences the paragraph states, printed as it states them: each taken of the
    # unrounded counts, so it can differ by 0.1 from the rounded counts printed above
    more = {"chunks than warps, mechanism profile": written["chunks"] - written["warps"],
            "chunks than warps, cycles profile": w["chunks"] - w["warps"],
            "rung 5 (accurate) than rung 6 (equal_halves), cycles profile":
                w["accurate"] - w["equal_halves"]}
    printed = {k: said(v, 1) for k, v in more.items()}
    print("MB more written, each difference of the unrounded counts:")
    for k, v in printed.items():
        print(f"  {k}: {v}")
    assert list(printed.values()) == ["16.1", "16.1", "16.4"]
    # no count reaches y's 268.4 MB (bf16 [4096, 8, 32, 128]): no kernel writes extra bytes,
    # the rest of y is written back after the kernel ends; the largest count 263.3 MB
    y_mb = 4096 * 8 * 32 * 128 * 2 / MB
    counts = [m[v]["ncu_dram_write_bytes"] / MB for v in ("warps", "chunks", "accurate",
                                                          "equal_halves")] + list(w.values())
    assert said(y_mb, 1) == "268.4" and max(counts) < y_mb
    assert said(max(counts), 1) == "263.3"
    # in both profiles the rung with the larger count is the slower: chunks against warps,
    # rung 5 (accurate) against rung 6 (equal halves)
    us = {n: prof[n]["gpu__time_duration.sum"] / 1e3 for n in w}
    for t, wr in ((us, w), ({v: m[v]["us"] for v in w}, {v: m[v]["ncu_dram_write_bytes"]
                                                          for v in w})):
        for slow, fast in (("chunks", "warps"), ("accurate", "equal_halves")):
            assert wr[slow] > wr[fast] and t[slow] > t[fast], (slow, fast, t, wr)
    # the two rungs' stores in sm_90 machine code, compiled here with the H200's plan
    x_meta = torch.empty(4096, 8, 32, 128, dtype=torch.bfloat16, device="meta")
    stores = {}
    try:
        from ropelib.course import load_schedule
        for v in ("warps", "chunks"):
            pv = ladder.plan(v, 4096, 8, 32, 128, 2, sms, knobs)
            a = dict(x_ptr=torch.empty(16, dtype=torch.bfloat16), y_ptr=torch.empty(
                16, dtype=torch.bfloat16), freqs_ptr=torch.empty(16), S=4096, B=8, H=32,
                HALF=64, BLOCK_HALF=64, BLOCK_S=pv.block_s, BLOCK_H=pv.block_h, BF16_RTNE=False,
                **dict(zip([f"stride_{t}{k}" for t in "xy" for k in "sbhd"], 2 * x_meta.stride())),
                stride_fs=128, **(dict(B_CHUNK=pv.chunk, ACCURATE=False) if v == "chunks" else {}))
            sass = load_schedule.schedule(getattr(ladder, ladder.KERNELS[v]), a,
                                          num_warps=pv.num_warps)["sass"]
            stores[v] = [re.sub(r"\s*(/\*.*|;.*)$", "", i).strip() for i in sass if "STG" in i]
    except compile_errors as exc:  # no compiler for this target here: say so
        compile_failed(exc)
    if len(stores) == 2:
        print(f"sm_90, Triton {triton.__version__}: the stores of warps {stores['warps']}, "
              f"of chunks {stores['chunks']}")

        # the same stores in the same order: the same opcodes, widths and offsets (which
        # registers hold the address and the data is the register allocator's choice)
        def shape_of(store):
            return re.sub(r"\bR\d+", "R", store)
        assert [shape_of(i) for i in stores["warps"]] == [shape_of(i) for i in stores["chunks"]]
        assert meta["triton"].startswith("3.6")      # the H200 run's Triton: the same code


def load_order():
    """A.1, loading x first: the finished kernel timed as two variants (three alternating
    rounds, one Python per variant, medians), x first or the table first; printed, the
    paragraph's numbers asserted."""
    _, knob_rows = measured.load("finished_kernel_knobs")
    order = {}
    for row in knob_rows:
        if row["pass"] == "forward":
            order.setdefault((row["case"], row["variant"]), []).append(row["ratio_to_copy"])
    order = {key: sorted(v)[len(v) // 2] for key, v in order.items()}
    X_FIRST_VARIANT, TABLE_FIRST_VARIANT = "x first, every tile", "as shipped"   # the CSV's names
    cases = ("bf16 sbhd s4096 b1 (32 MiB)", "bf16 sbhd s1024 b8 (64 MiB)")
    for c in cases:
        print(f"finished kernel, forward, ratio to a copy, {c}: x first "
              f"{order[c, X_FIRST_VARIANT]:.3f}, the table first "
              f"{order[c, TABLE_FIRST_VARIANT]:.3f}")
    assert [said(order[c, v]) for c in cases for v in (X_FIRST_VARIANT, TABLE_FIRST_VARIANT)] \
        == ["0.931", "0.892", "0.804", "0.835"]


def table_probe():
    """Section 5: `benchmarks/ladder_table_probe.py` (H200): rung 6, a copy of it that loads cos
    and sin from fp32 tables instead of evaluating them, and the finished kernel, each against a
    device copy at four sizes, with the two rungs' sm_90 instruction counts and registers;
    printed, every number the section's text states asserted. Returns {case: {provider: row}}."""
    probe_meta, probe_rows = measured.load("ladder_table_probe")
    assert probe_meta["date"].startswith("2026-12-04")      # "in the probe's run (2026-12-04)"
    tab = {}
    for row in probe_rows:
        tab.setdefault(row["case"], {})[row["provider"]] = row
    print(f"{measured.where(probe_meta)}, {probe_rows[0]['rounds']} rounds: ratio to a copy "
          "(the copy's time over the kernel's)")
    print(f"  {'case':14s}{'MiB':>5s}{'copy us':>9s}{'last rung':>11s}{'from tables':>13s}"
          f"{'finished':>10s}{'SASS rung / tables':>20s}{'registers':>11s}")
    for case, p in tab.items():
        rung, tables = p["equal_halves"], p["from_table"]
        mib = math.prod(rung[k] for k in ("seq_len", "batch", "heads", "head_dim")) * 2 >> 20
        print(f"  {case:14s}{mib:5d}{p['copy']['ms'] * 1e3:9.1f}{rung['ratio_to_copy']:11.3f}"
              f"{tables['ratio_to_copy']:13.3f}{p['ropelib']['ratio_to_copy']:10.3f}"
              f"{rung['sass_instructions']:>12d} / {tables['sass_instructions']:<5d}"
              f"{rung['registers']:>6d} / {tables['registers']}")
        assert p["copy"]["ratio_to_copy"] == 1.0 and p["copy"]["grid"] == rung["grid"]
        for row in p.values():                       # the ratios are times, as everywhere here
            assert abs(row["ratio_to_copy"] - p["copy"]["ms"] / row["ms"]) < 1e-9
        assert tables["bit_equal_to_rung"] and p["ropelib"]["bit_equal_to_rung"]   # same outputs
    LARGE_PROBE = ("s4096-b8", "s16384-b8-h8", "s32768-b1")
    gap = {c: 100 * (1 - tab[c]["equal_halves"]["ratio_to_copy"]) for c in tab}
    bought = {c: 100 * (tab[c]["from_table"]["ratio_to_copy"]
                        - tab[c]["equal_halves"]["ratio_to_copy"]) for c in tab}
    print("points of a copy: the rung's gap", {c: round(v, 1) for c, v in gap.items()},
          "\n                  bought by the tables", {c: round(v, 1) for c, v in bought.items()})
    assert list(tab) == [*LARGE_PROBE, "s16-b64"]
    MIB = {c: math.prod(tab[c]["copy"][k] for k in ("seq_len", "batch", "heads", "head_dim")) * 2
           >> 20 for c in tab}
    assert MIB == {"s4096-b8": 256, "s16384-b8-h8": 256, "s32768-b1": 256, "s16-b64": 8}
    assert (said(min(gap[c] for c in LARGE_PROBE), 1),
            said(max(gap[c] for c in LARGE_PROBE), 1)) == ("8.2", "9.3")   # "8.2 to 9.3 points"
    assert (said(min(bought[c] for c in LARGE_PROBE), 1),
            said(max(bought[c] for c in LARGE_PROBE), 1)) == ("0.7", "1.5")
    assert max(p["equal_halves"]["sass_instructions"] // p["from_table"]["sass_instructions"]
               for p in tab.values()) == 17                             # "up to 17 times"
    small = tab["s16-b64"]
    assert [said(small[n]["ratio_to_copy"]) for n in ("equal_halves", "from_table")] == \
        ["0.730", "0.904"]
    assert (said(bought["s16-b64"], 1), said(gap["s16-b64"], 1)) == ("17.4", "27.0")
    # the 8 MiB rung's rounds: their median, fastest and slowest (section 5's 16-token panel)
    assert [said(small["equal_halves"][k] * 1e3, 1) for k in ("ms", "ms_min", "ms_max")] == \
        ["12.3", "11.0", "67.6"]
    return tab


def stall_kernels(path=STALLS_CSV):
    """Section 5's cycles profile (`benchmarks/ladder_stalls_ncu.py`, Nsight Compute's warp
    states): its kernels' metrics, checked to be the H200's and in the order STALL_NAMES gives,
    one size after the other."""
    kernels = measured.ncu_kernels(path)
    assert compare.read_meta(path)["gpu"] == "NVIDIA H200"
    assert [k["kernel"] for k in kernels[:len(STALL_NAMES)]] == [
        "_copy_kernel", "_rope_batch_reuse_kernel", "_ladder_heads_kernel", "_ladder_tile_kernel",
        "_ladder_tile_kernel", "_ladder_chunk_kernel", "_ladder_chunk_kernel",
        "_ladder_final_kernel", "_rope_kernel"]
    return kernels


def stall_details(prof, kernels, profile, resident, mechanism=STEP_MECHANISM):
    """Appendix A.2: the cycles profile's details, from section 5's derived numbers (`prof`, made
    by the notebook's `profile(kernels, case)`) and resident warps: what the profiles say of
    each step (`mechanism`, the long form of section 5's table's last column, printed), the tile
    rung's time predicted at b = 1, the same profile at the GPU's own clock, and every warp
    state; printed, the appendix's numbers and `mechanism`'s asserted, the warp-state table
    returned."""
    b8, b1 = prof["s4096-b8"], prof["s32768-b1"]
    print("what the profiles say of each step (the steps: section 5's table)")
    for name in ladder.NAMES[1:]:
        print(f"  {name:13s} {mechanism[name]}")
    print()
    # its numbers, on the cycles profile: the writes and DRAM rates at b = 8, the sin/cos
    # copies at b = 1 (the tile rung's instructions and rung 6's waiting warps: below)
    acc, eh = b8["accurate"], b8["equal_halves"]
    extra_mb = b8["chunks"]["written_mb"] - b8["warps"]["written_mb"]
    assert f"{r(extra_mb)} MB more reach DRAM" in mechanism["chunks"]
    assert f"{r(acc['written_mb'] - eh['written_mb'])} MB fewer writes" in mechanism["equal_halves"]
    assert f"{r(acc['tb_s'], 2)} -> {r(eh['tb_s'], 2)} TB/s" in mechanism["equal_halves"]
    copies = {n: round(b1[n]["sin_cos_copies"]) for n in ("tile", "warps", "chunks")}
    assert f"{copies['warps']} times, not {copies['tile']}" in mechanism["warps"]
    assert copies["chunks"] == 1 and "each sin/cos once" in mechanism["chunks"]
    # the tile rung (BLOCK_S = 1 at h = 32, the heads rung's tile in the 3-D form) at b = 1: 3 %
    # more instructions at lower occupancy; instructions over the issue rate predict the time
    # under the profiler
    more_inst = b1["tile"]["inst_m"] / b1["heads"]["inst_m"]
    predicted = more_inst * b1["heads"]["issuing"] / b1["tile"]["issuing"]
    print(f"b = 1, tile against heads: {more_inst:.3f}x the instructions, issuing "
          f"{b1['heads']['issuing']:.0%} -> {b1['tile']['issuing']:.0%}, occupancy "
          f"{b1['heads']['occupancy']:.1f} -> {b1['tile']['occupancy']:.1f} %: predicted "
          f"{predicted:.3f}x the time, measured {b1['tile']['us'] / b1['heads']['us']:.3f}x")
    assert r(more_inst - 1, 2) == 0.03 and [r(b1[n]["occupancy"]) for n in ("heads", "tile")] == \
        [47.3, 41.4]
    assert f"{round(100 * (more_inst - 1))} % more instructions" in mechanism["tile"]
    assert (r(predicted, 3), r(b1["tile"]["us"] / b1["heads"]["us"], 3)) == (1.043, 1.041)
    # the same profile at the GPU's own clock (Nsight Compute told to leave it alone): the tile
    # rung's step as the timed runs see it, and the instructions over the issue rate predict it
    timed_b1 = {n: t["ms"] * 1e3 for n, t in measured.timings("ladder", "s32768-b1").items()}
    FREE_CSV = measured.RESULTS / "ladder_stalls_ncu-nvidia-h200-20261201-2335-clock-none.csv"
    free_kernels = measured.ncu_kernels(FREE_CSV)
    assert "--clock-control none" in compare.read_meta(FREE_CSV)["what"]
    assert [k["kernel"] for k in free_kernels] == [k["kernel"] for k in kernels]
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
    assert r(timed_b1["tile"]) == 191.1
    assert (r(free_predicted, 2), r(free["tile"]["us"] / free["heads"]["us"], 2),
            r(timed_b1["tile"] / timed_b1["heads"], 2)) == (1.09, 1.08, 1.09)

    # every warp state (Nsight Compute's 18), as warps a scheduler in an average cycle: they sum,
    # within 2 %, to the resident warps. From rung 5 to rung 6, at the same residency, the warps
    # leave the other states for long_scoreboard (waiting on a load)
    STATE, ISSUE = "smsp__average_warps_issue_stalled_", "smsp__issue_active.avg.per_cycle_active"
    STATE_KERNELS = ("heads", "warps", "accurate", "equal_halves", "finished")
    states = {}
    for name in STATE_KERNELS:
        m = kernels[STALL_NAMES.index(name)]["metrics"]
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
    # the prose: long_scoreboard 4.90 -> 5.50 (+0.60); each of the six other states shown falls,
    # the other 11 together rise (0.17 -> 0.22)
    assert [r(v, 2) for v in (acc_st["long_scoreboard"], eh_st["long_scoreboard"])] == [4.90, 5.50]
    assert r(delta["long_scoreboard"], 2) == 0.60
    assert f"{r(delta['long_scoreboard'])} more warps a scheduler waiting" in mechanism["equal_halves"]
    assert [(r(acc_st[st], 2), r(eh_st[st], 2)) for st in ("no_instruction", "not_selected",
                                                            "selected", "wait")] == \
        [(0.35, 0.11), (0.53, 0.36), (0.46, 0.38), (0.43, 0.37)]
    assert all(delta[st] < 0 for st in SHOWN_STATES[1:])
    assert [r(other[n], 2) for n in ("accurate", "equal_halves")] == [0.17, 0.22]
    assert abs(sum(delta.values())) < 0.1                        # the same residency
    # heads -> warps: more resident warps, the same warps on loads (4.93 -> 4.94)
    assert [r(states[n]["long_scoreboard"], 2) for n in ("heads", "warps")] == [4.93, 4.94]
    assert [r(resident[n], 1) for n in ("heads", "warps")] == [6.4, 7.1]
    return states


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


# Section 3's timing: the rungs as the notebook launches them
def time_rungs(x, calls, committed, where, *, timed):
    """Time each rung as the notebook launches it (`calls`: rung name -> a call that launches
    it on x) beside y.copy_(x) with do_bench, when `timed` (on a GPU), and print each one's
    speed as a % of the copy's, with its step from the rung before, beside the same columns
    of a committed run (`committed`: rung name -> % of a copy, measured on `where`). Returns
    the live % by name ({} when not timed). The calls' outputs are checked by the cell."""
    live = {}
    if timed:
        from triton.testing import do_bench
        y = torch.empty_like(x)
        copy_ms = do_bench(lambda: y.copy_(x), quantiles=[0.5, 0.2, 0.8])[0]
        for name, call in calls.items():
            live[name] = 100 * copy_ms / do_bench(call, quantiles=[0.5, 0.2, 0.8])[0]
    from ropelib import runtime
    here = runtime.mode() if timed else "not timed here: it needs a GPU"
    print(f"x {list(x.shape)} {str(x.dtype).replace('torch.', '')}: each rung's speed as a % of "
          "a copy's (the copy's median time over the rung's), and its step from the rung before")
    print(f"  live: {here}\n  committed: {where}")
    print(f"  {'rung':13s} {'live':>7s} {'step':>6s}   {'committed':>9s} {'step':>6s}")
    names = list(calls)
    for i, name in enumerate(names):
        prev = names[i - 1] if i else None
        now = f"{live[name]:7.1f}" if name in live else f"{'-':>7s}"
        now_step = (f"{live[name] - live[prev]:+6.1f}" if prev and name in live
                    else f"{'':6s}")
        was_step = f"{committed[name] - committed[prev]:+6.1f}" if prev else f"{'':6s}"
        print(f"  {name:13s} {now} {now_step}   {committed[name]:9.1f} {was_step}")
    for label, pct in (("live", live), ("committed", committed)):
        if len(pct) > 1:
            steps = {b: pct[b] - pct[a] for a, b in zip(names, names[1:])}
            big = max(steps, key=steps.get)
            print(f"  the biggest step, {label}: {big} ({steps[big]:+.1f} points)")
    return live


# Exercise 1's timing on a GPU (the notebook's `time_exercise_1` calls these)
def time_against_copy(x, y, want, yours, solution, others=(), *, timed=True):
    """Time y.copy_(x), each of your launches (yours: name -> (passed its check, a call that
    writes y)), the worked solution's (a call that writes y) and `others` ((name, call) pairs)
    with do_bench; print each median and its speed as a fraction of the copy's, and return those
    fractions by name. Yours are timed only once they pass their check, and only after their
    output at this size is asserted to be `want` (the reference); a solution of None is not
    timed.

    Without a GPU (`timed=False`) nothing is timed: each of your launches that has passed its
    check, and the worked solution's, runs once into a NaN-filled y and is asserted to be
    `want`, so the launch a GPU would time is known to compute RoPE; returns {}."""
    from ropelib import runtime
    mode = runtime.mode()
    if timed:
        print(f"x {list(x.shape)} {str(x.dtype).replace('torch.', '')} "
              f"({x.numel() * x.element_size() >> 20} MiB), {mode}: median us "
              "(20-80 % quantiles), speed as a fraction of the copy's")
    else:
        print(f"x {list(x.shape)} {str(x.dtype).replace('torch.', '')}, {mode}: each launch "
              "run once and compared with the reference; not timed (that needs a GPU)")

    def checked(name, run):
        y.fill_(float("nan"))                  # an element the kernel does not write stays NaN
        run()
        torch.testing.assert_close(                # correct at this size too
            y, want, msg=lambda m, name=name: f"{name}, x {list(x.shape)}: {m}")

    to_time = {}
    for name, (passed, run) in yours.items():
        if not passed:
            print(f"  {name}: {'timed' if timed else 'launched'} here once it passes its check "
                  "above")
            continue
        checked(name, run)
        to_time[name] = run
        if not timed:
            print(f"  {name:26s} launched here: equal to the reference")
    if not timed:
        if solution is not None and want is not None:
            checked("worked solution", solution)
            print(f"  {'worked solution':26s} launched here: equal to the reference")
        for name, _ in others:
            print(f"  {name:26s} timed on a GPU only")
        return {}
    from triton.testing import do_bench
    if solution is not None:
        to_time["worked solution"] = solution
    to_time.update(others)
    copy_ms = do_bench(lambda: y.copy_(x), quantiles=[0.5, 0.2, 0.8])
    ratios = {}
    for name, run in {"y.copy_(x)": None, **to_time}.items():
        ms = copy_ms if run is None else do_bench(run, quantiles=[0.5, 0.2, 0.8])
        ratios[name] = copy_ms[0] / ms[0]
        print(f"  {name:26s} {ms[0] * 1e3:7.1f} us ({ms[1] * 1e3:.1f}-{ms[2] * 1e3:.1f})  "
              f"{ratios[name]:.2f} of a copy")
    return ratios


def not_timed_here(shape, launch, committed, where):
    """Say, without a GPU, what a timing cell would do on one: time the launches it checked at
    bf16 `shape` on `launch` (a ladder.Plan, or words) beside a copy; and print `committed`
    ({name: ratio to a copy}), the committed runs at that shape measured on `where`, that a GPU's
    timings would be set beside."""
    if isinstance(launch, ladder.Plan):
        launch = (f"grid {launch.grid}, BLOCK_S={launch.block_s} BLOCK_H={launch.block_h} "
                  f"B_CHUNK={launch.chunk}, {launch.num_warps} warps")
    print(f"Timing needs a GPU. On an H200 this cell times them at x {list(shape)} bf16 "
          f"({launch}) beside y.copy_(x). The committed runs at that shape ({where}):")
    for name, ratio_to_copy in committed.items():
        print(f"  {name:48s} {ratio_to_copy:.3f} of a copy")


def against_committed(live, committed, band=0.15, live_what="", committed_what=""):
    """Print each live ratio to a copy beside the committed run's for the same shape, and
    assert it lies within `band` (a fraction) of it: another GPU, driver or day moves a ratio
    by a few per cent, not by a sixth. `live_what` and `committed_what` say what each timed
    where they differ (the pairs, the GPU), printed beside the numbers."""
    live_what = f" ({live_what})" if live_what else ""
    committed_what = f"{committed_what}; " if committed_what else ""
    for name, (was, where) in committed.items():
        print(f"  {name:26s} live {live[name]:.3f} of a copy{live_what}; committed {was:.3f} "
              f"({committed_what}{where})")
        assert abs(live[name] / was - 1) <= band, \
            f"{name}: {live[name]:.3f} of a copy here, {was:.3f} committed: more than " \
            f"{band:.0%} apart"


# --- the appendices' helpers and checks ----------------------------------------------------------

def ratio(runs, case, provider, pass_="forward"):
    """A two_pass-style table's ratio to a copy ({(case, pass): {provider: row}})."""
    return runs[(case, pass_)][provider]["ratio_to_copy"]


def compile_failed(exc, what="compiling for sm_90", limit=300):
    """Print one line saying that `what` failed here and why, and return None (a cell writes
    `sched = compile_failed(exc)`). The reason is the exception's type and message, cut to
    `limit` characters by keeping its start (the command or kernel that failed) and its end
    (where a compiler writes its error)."""
    msg = " ".join(str(exc).split())
    if len(msg) > limit:
        half = (limit - 5) // 2
        msg = f"{msg[:half]} ... {msg[-half:]}"
    print(f"{what} did not work here ({type(exc).__name__}: {msg})")
    return None


def finished_schedule(shape, sms, knobs, x_first=None):
    """A.5: (launch, load_schedule) of the finished kernel as launch.plan launches it on a GPU
    of `sms` SMs and tile `knobs` for a bf16 sbhd call with angles of `shape` (nothing is
    allocated: the shapes are on the `meta` device); `x_first` overrides the planner's
    X_FIRST."""
    from ropelib.course import load_schedule
    from ropelib.kernels import launch
    s_, b_, h_, d_ = shape
    xm = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    tile = launch.pick_tiles(s_, b_, (h_, 0), d_, d_, 2, sms, **knobs)
    lau, ptrs = launch.plan(launch.View.of(xm), launch.View.of(xm),
                            launch.Table(torch.empty(s_, d_, device="meta"), None),
                            launch.Positions(), R=d_, interleaved=False, backward=False,
                            layout="sbhd", tiles=tile)
    args = dict(lau.args) if x_first is None else dict(lau.args, X_FIRST=x_first)
    pointers = {n: None if p is None else torch.empty(16, dtype=p.dtype)
                for n, p in zip(lau.launcher.pointer_names, ptrs)}
    return lau, load_schedule.schedule(lau.launcher.kernel, {**pointers, **args},
                                       num_warps=lau.num_warps)


def opcode_profile(mech):
    """A.3: the finished kernel's executed warp instructions beside rung 6's, opcode by opcode
    (`benchmarks/ladder_opcodes_ncu.py`, bf16 sbhd s4096 b8 on the H200), printed, with every
    number A.3's text states asserted; `mech`: section 1's mechanism rows (s4096-b8)."""
    OPCODE_CSV = measured.RESULTS / "ladder_opcodes_per_opcode-nvidia-h200.csv"
    TIMED_CSV = measured.RESULTS / "ladder_opcodes_ncu-nvidia-h200.csv"
    elements = 4096 * 8 * 32 * 128                      # the profiled bf16 sbhd s4096 b8 launch
    FLOAT_OPS = ("FFMA", "FMUL", "FADD", "FSETP", "FSEL", "F2FP")
    INTEGER_OPS = ("IMAD", "IADD3", "VIADD", "ISETP", "IABS", "LEA", "LDC", "S2R", "SHF", "LOP3",
                   "MOV", "ULDC", "S2UR", "UIMAD", "ULEA", "VIADDMNMX", "USHF")
    op_meta = compare.read_meta(OPCODE_CSV)
    launched = measured.ncu_kernels(OPCODE_CSV)         # chunks, accurate, equal_halves, finished
    assert [k["kernel"] for k in launched] == ["_ladder_chunk_kernel", "_ladder_chunk_kernel",
                                               "_ladder_final_kernel", "_rope_kernel"]
    r4, r5, r6, fin_ops = [k["instances"]["sass__inst_executed_per_opcode"] for k in launched]
    extra = {op: fin_ops.get(op, 0) - r6.get(op, 0) for op in set(r6) | set(fin_ops)}
    total_extra = sum(extra.values())
    timed = {k["id"]: k["metrics"]["gpu__time_duration.sum"] / 1e3
             for k in measured.ncu_kernels(TIMED_CSV)}
    more = sum(fin_ops.values()) / sum(r6.values())
    print(f"{op_meta['gpu']}, Triton {op_meta['triton']}: warp instructions executed, rung 6 "
          f"{sum(r6.values()):,.0f}, finished kernel {sum(fin_ops.values()):,.0f} "
          f"({more - 1:+.1%})")
    print(f"  {'opcode':8s}{'rung 6':>13s}{'finished':>13s}{'extra':>13s}  per element")
    for op in sorted(extra, key=lambda o: -abs(extra[o]))[:6]:
        print(f"  {op:8s}{r6.get(op, 0):>13,.0f}{fin_ops.get(op, 0):>13,.0f}{extra[op]:>+13,.0f}"
              f"  {extra[op] * 32 / elements:+.3f}")
    integer_share = sum(extra.get(op, 0) for op in INTEGER_OPS) / total_extra
    print(f"  of the extra: the guard's FSEL {extra['FSEL'] / total_extra:.0%}, integer "
          f"{integer_share:.0%}")
    print(f"  under Nsight Compute: rung 6 {timed[2]:.1f} us, the finished kernel "
          f"{timed[3]:.1f} us ({timed[3] / timed[2] - 1:+.1%})")
    # rungs 4 and 5 are the same code on this GPU (no MUFU in either)
    assert r4 == r5 and "MUFU" not in r4
    # the rotation's arithmetic is rung 6's (the same sin/cos: the shortcut is taken); no SEL or
    # PRMT over rung 6; the guard's FSEL at most one per eight elements, a fifth of the extra
    assert all(fin_ops[op] == r6[op] for op in FLOAT_OPS if op != "FSEL")
    assert fin_ops.get("SEL", 0) <= r6.get("SEL", 0) and fin_ops["PRMT"] == r6["PRMT"]
    assert 0 < extra["FSEL"] * 32 / elements <= 0.125, "the guard: one FSEL per 8 elements"
    assert round(extra["FSEL"] / total_extra, 1) == 0.2, "a fifth of the extra is the guard's"
    assert integer_share > 0.6, "most of the rest: integer arithmetic"
    assert round(more - 1, 3) == 0.068, f"{more - 1:.3%} more warp instructions, not 6.8 %"
    assert abs(timed[3] / timed[2] - 1) < 0.01, "level with rung 6 within 1 % under this profile"
    # section 1's mechanism profile, a separate run, agrees within two points
    mech_extra = mech["ropelib"]["ncu_warp_inst_per_element"] \
        / mech["equal_halves"]["ncu_warp_inst_per_element"]
    print(f"section 1's mechanism profile: {mech_extra - 1:+.1%} warp instructions over rung 6")
    assert abs(mech_extra - more) < 0.02, "the two profiles within two points"


def _planned_two_pass(batch, **kw):
    """ropelib's two-pass route for a bf16 sbhd call [16384, batch, 32, 128] with angles,
    planned on shapes alone (the `meta` device)."""
    from ropelib.kernels import launch
    xm = torch.empty(16384, batch, 32, 128, dtype=torch.bfloat16, device="meta")
    route, _ = launch.plan_two_pass(launch.View.of(xm), launch.View.of(xm),
                                    launch.Table(torch.empty(16384, 128, device="meta"), None),
                                    launch.Positions(), R=128, interleaved=False,
                                    backward=False, layout="sbhd", **kw)
    return route


def _compiled_rotate(rot_pass, flags):
    """A planned flat pass compiled for sm_90 at the GPU's program size (load_schedule)."""
    from ropelib.course import load_schedule
    from ropelib.kernels import tiles
    bf16, fp32 = torch.empty(16, dtype=torch.bfloat16), torch.empty(16)
    args = dict(zip(rot_pass.launcher.pointer_names,
                    (bf16, bf16, None, None, fp32, fp32, None, flags)),
                **dict(rot_pass.args, XBLOCK=tiles.TWO_PASS_ELEMENTS))
    return load_schedule.schedule(rot_pass.launcher.kernel, args, num_warps=rot_pass.num_warps)


def flat_pass_schedule():
    """Exercise 3: ropelib's flat pass as the route plans it for 1 GiB bf16 sbhd
    (s16k b8), launched without flags as section 5 profiled it, compiled for sm_90: its
    load_schedule (registers, loads in machine-code order, how many before the first
    multiply). Raises what a missing compiler raises."""
    return _compiled_rotate(_planned_two_pass(8).rotate_pass, None)


def paired_rows_probe():
    """A.9: `benchmarks/paired_rows_probe.py` (H200, forward): the element-wise flat pass
    reading all of its fp32 rows, half of them, and both members of a pair in one thread, beside
    torch.compile and apply_rope; printed, with every number A.9's text states asserted."""
    pr = measured.probe("paired_rows_probe")
    pr_meta, _ = measured.load("paired_rows_probe")
    cols = ("torch.compile (16-bit table)", "ropelib.apply_rope (freqs)", "rows=fp32",
            "rows=paired", "pairs per thread fp32 8 rows 2 warps",
            "pairs per thread fp32 16 rows 4 warps")
    # each column's header, whole in its 24 characters (the two pass-of-pairs launches apart)
    header = dict(zip(cols, ("torch.compile 16-bit", "apply_rope (freqs)", "rows=fp32",
                             "rows=paired", "pairs: 8 rows 2 warps", "pairs: 16 rows 4 warps")))
    assert all(len(h) <= 22 for h in header.values()) and len(set(header.values())) == len(cols)
    print(f"{measured.where(pr_meta)}: forward, ratio to a copy (pairs: both members of a pair "
          "in one thread, fp32 rows)")
    print(f"{'case':26s}" + "".join(f"{header[c]:>24s}" for c in cols))
    for case, rows in pr.items():
        print(f"{case:26s}" + "".join(f"{rows[c]['ratio_to_copy']:24.3f}" for c in cols))
        assert not any("NOT" in name for name in rows), case      # every copy: apply_rope's bits
        r_ = {c: rows[c]["ratio_to_copy"] for c in cols}
        assert r_["rows=paired"] < r_["rows=fp32"], case          # half the bytes, slower
        assert r_["pairs per thread fp32 8 rows 2 warps"] > r_["rows=fp32"] + 0.008, case
        assert r_["pairs per thread fp32 8 rows 2 warps"] >= \
            r_["torch.compile (16-bit table)"] - 0.002, case
    one_gib = {c: said(pr["bf16 sbhd 1 GiB s16k b8"][c]["ratio_to_copy"]) for c in cols}
    # the two 256 MiB cases: pairs per thread level with torch.compile (well within the spread)
    assert all(abs(pr[c][cols[4]]["ratio_to_copy"] - pr[c][cols[0]]["ratio_to_copy"]) < 0.01
               for c in ("bf16 bshd 256 MiB s4k b8", "bf16 sbhd 256 MiB s4k b8"))
    assert [one_gib[c] for c in cols[:5]] == ["0.994", "0.938", "0.948", "0.896", "0.993"]
    # at the exercises' timed size (s4k b8 sbhd): the element-wise pass (Exercise 2's design)
    # against the pass of pairs (Exercise 3's), the H200's numbers Question 6 quotes
    s4k = [pr["bf16 sbhd 256 MiB s4k b8"][c]["ratio_to_copy"] for c in (cols[2], cols[4])]
    assert [said(v) for v in s4k] == ["0.968", "0.993"]
    assert said(100 * (s4k[1] - s4k[0]), 1) == "2.5"                 # "2.5 points of a copy"


def elementwise_route(tp, tp_meta):
    """A.9: the element-wise flat pass (the design of `rows=fp32`) in the whole route, an H200
    run of the two passes with it, against the pass of pairs in the main two_pass run (`tp`,
    `tp_meta`); printed, every number A.9's text states asserted."""
    s16k = "bf16 sbhd 1 GiB s16k b8"
    tp_elementwise = measured.two_pass(measured.GPU + "-20261128-0853")
    ew_meta, _ = measured.load("two_pass", measured.GPU + "-20261128-0853")
    assert ew_meta["gpu"] == tp_meta["gpu"] == "NVIDIA H200"
    print(f"{measured.where(ew_meta)}, the element-wise flat pass, {s16k}: two-pass "
          f"{ratio(tp_elementwise, s16k, 'two-pass'):.3f}, finished "
          f"{ratio(tp_elementwise, s16k, 'finished'):.3f}; the pass of pairs (main table): "
          f"{ratio(tp, s16k, 'two-pass'):.3f}, finished {ratio(tp, s16k, 'finished'):.3f}")
    assert [said(ratio(tp_elementwise, s16k, c)) for c in ("two-pass", "finished")] == \
        ["0.931", "0.924"]
    assert [said(ratio(tp, s16k, c)) for c in ("two-pass", "finished")] == ["1.002", "0.932"]


@triton.jit
def _one_angle_kernel(freqs_ptr, y_ptr, N, BLOCK: tl.constexpr):
    # cos + sin of one fp32 angle a thread: one angle's share of libdevice's slow path
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    t = tl.load(freqs_ptr + i, mask=i < N, other=0.0)
    tl.store(y_ptr + i, tl.cos(t) + tl.sin(t), mask=i < N)


def slow_path_share(sol, x_vectors):
    """Exercise 1's worked solution (`sol`, its load_schedule at the H200's launch; `x_vectors`
    of its 16-byte loads are x's): are its 4-byte loads and its local memory (STL, LDL) spills,
    or libdevice's sin/cos slow path for large angles (a few reads of a constant table, a small
    local array)? Compiles `_one_angle_kernel`, one angle a thread, for sm_90 to read one
    angle's share of that path, prints both, and asserts the solution's are its angles' shares:
    no spill. Raises what a missing compiler raises."""
    from ropelib.course import load_schedule
    fp32 = torch.empty(16)
    one_angle = load_schedule.schedule(_one_angle_kernel, dict(freqs_ptr=fp32, y_ptr=fp32,
                                                               N=1 << 20, BLOCK=256), num_warps=8)
    slow_path = dict(table_reads=load_schedule.load_widths(one_angle)[4] - 1,  # less its angle
                     local_stores=one_angle["local_stores"], local_loads=one_angle["local_loads"])
    widths = load_schedule.load_widths(sol)
    angles = 4 * (widths[16] - x_vectors)       # fp32 angles in the 16-byte loads beside x's
    narrow = [ins for _, ins in sol["loads"] if ".128" not in ins]
    print(f"its angles: {angles} a thread, in {widths[16] - x_vectors} loads of 16 bytes; "
          f"one angle's slow path: {slow_path['table_reads']} table reads, "
          f"{slow_path['local_stores']} local stores, {slow_path['local_loads']} local loads")
    print(f"its 4-byte loads: {len(narrow)}; its local memory: {sol['local_stores']} stores, "
          f"{sol['local_loads']} loads; {sol['registers']} registers")
    # every 4-byte load reads the slow path's constant table, and the local memory is the slow
    # path's array once per angle: none of it is a spill
    assert angles == 8 and all(".CONSTANT" in ins for ins in narrow)
    assert len(narrow) == angles * slow_path["table_reads"]
    assert all(sol[k] == angles * slow_path[k] for k in ("local_stores", "local_loads"))
    if triton.__version__.startswith(("3.6", "3.9")):     # the text: local memory with 3.6 only
        assert (slow_path["local_stores"], slow_path["local_loads"]) == \
            ((4, 6) if triton.__version__.startswith("3.6") else (0, 0))
