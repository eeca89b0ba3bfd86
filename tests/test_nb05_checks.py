"""Notebook 05's checks module: its claims hold on the committed CSVs, and Exercise 1b's store
condition refuses a kernel that stores pairs at stride 2."""
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from ropelib.course import checks_nb05, ladder, load_schedule, measured, nb05_waterfall
from ropelib.kernels import tiles

ROOT = Path(__file__).resolve().parents[1]

SMS_H200 = 132
H200_KNOBS = dict(tile_loop=tiles.TILES_BY_GPU["NVIDIA H200"]["loop"],
                  tile_noloop=tiles.TILE_NOLOOP, tile_wide=tiles.TILE_WIDE)


def _stall_cells():
    """Section 5's two cells that derive the cycles profile's numbers, as the notebook has them."""
    import jupytext
    nb = jupytext.read(ROOT / "notebooks" / "05-finished-kernel.py", fmt="py:percent")
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    first = next(i for i, t in enumerate(code) if "def cycles(" in t)
    assert "WARPS_PER_SCHEDULER" in code[first + 1]
    return code[first:first + 2]


def _run_stall_cells():
    ns = dict(checks_nb05=checks_nb05, measured=measured)
    for cell in _stall_cells():
        exec(compile(cell, "<section 5's stall cell>", "exec"), ns)  # noqa: S102
    return ns


@pytest.fixture(scope="module")
def ladder_run():
    """What section 5 reads: the H200 ladder run (meta, rows as nb05_waterfall.read gives them),
    the H100 processes' rows, the mechanism profile at s4096-b8 and its header, the hatched
    steps."""
    meta, rows = nb05_waterfall.read()
    _, runs = measured.load("ladder_runs", "nvidia-h100-80gb-hbm3")
    mech_meta, _ = measured.load("mechanism")
    hatched = {c: ladder.within_both_spreads(rows, c) for c in dict.fromkeys(r["case"] for r in rows)}
    return dict(meta=meta, rows=rows, runs=runs, mech=measured.mechanism("s4096-b8"),
                mech_meta=mech_meta, hatched=hatched)


def test_section_5_and_appendix_a1_claims_hold_on_the_committed_csvs(ladder_run, capsys):
    d = ladder_run
    checks_nb05.steps_table(d["rows"], d["meta"], d["runs"], d["mech"], d["mech_meta"],
                            SMS_H200, H200_KNOBS)
    checks_nb05.one_run_steps(d["rows"], d["runs"])
    checks_nb05.sixteen_tokens(d["rows"], d["hatched"])
    checks_nb05.heads_one_change_at_a_time(d["mech"], lambda r: r)
    checks_nb05.one_run_writes(d["mech"], d["meta"], SMS_H200, H200_KNOBS,
                               (RuntimeError, OSError, ImportError))
    checks_nb05.load_order()
    out = capsys.readouterr().out
    assert "heads8_loop_b_w2" in out and "x first 0.931" in out and "13.2, 51.5" in out
    ns = _run_stall_cells()
    st = checks_nb05.stall_details(ns["prof"], ns["kernels"], ns["profile"], ns["resident"])
    assert round(st["equal_halves"]["long_scoreboard"] - st["accurate"]["long_scoreboard"], 2) == 0.60
    assert "what the profiles say of each step" in capsys.readouterr().out


def test_a_changed_step_fails_the_table_check(ladder_run):
    d = ladder_run
    # rung 6 at s4096-b8 a point faster than measured: the table's +5.5 no longer holds
    rows = [dict(r, pct_of_copy=r["pct_of_copy"] + 1.0)
            if (r["case"], r["provider"]) == ("s4096-b8", "equal_halves") else r
            for r in d["rows"]]
    with pytest.raises(AssertionError):
        checks_nb05.steps_table(rows, d["meta"], d["runs"], d["mech"], d["mech_meta"],
                                SMS_H200, H200_KNOBS)
    with pytest.raises(AssertionError):
        checks_nb05.one_run_steps(rows, d["runs"])


def test_a_sentence_out_of_step_with_the_profile_fails(monkeypatch):
    ns = _run_stall_cells()
    said_other = dict(checks_nb05.STEP_MECHANISM,
                      warps="b = 8: level; b = 1: each sin/cos evaluated 16 times, not 32")
    with pytest.raises(AssertionError):
        checks_nb05.stall_details(ns["prof"], ns["kernels"], ns["profile"], ns["resident"],
                                  said_other)


# each helper that checks what a markdown cell states, and numbers that cell must state: the
# notebook calls the helper in the code cell right after it
PLACED = {
    "steps_table": ("+16.5 / +12.2", "−29.6 / −16.1", "7.6 times", "0.38 → 0.29", "0.6 points"),
    "one_run_steps": ("1.2 %", "−0.0 and +0.3", "2.7 points", "2.8"),
    "sixteen_tokens": ("40.7 and 41.9", "13.2 µs", "51.5 µs", "35.6 points"),
    "heads_one_change_at_a_time": ("178.1 µs against", "about 9 µs", "147.6", "146.8 µs"),
    "one_run_writes": ("16.1 MB", "16.4 MB", "268.4 MB", "263.3 MB"),
    "load_order": ("0.931", "0.892", "0.804", "0.835"),
    "stall_details": ("What the profiles say of each step",),
}


@pytest.mark.parametrize("helper", sorted(PLACED))
def test_each_check_follows_the_text_it_checks(helper):
    import jupytext
    nb = jupytext.read(ROOT / "notebooks" / "05-finished-kernel.py", fmt="py:percent")
    cells = [(c.cell_type, c.source) for c in nb.cells]
    (i,) = [i for i, (kind, src) in enumerate(cells)
            if kind == "code" and f"checks_nb05.{helper}(" in src]
    kind, before = cells[i - 1]
    assert kind == "markdown", f"{helper}: the cell before its call is not the text it checks"
    for number in PLACED[helper]:
        assert number in before, f"{helper}: the text before its call does not state {number!r}"


def test_a_changed_number_fails_the_stall_check(monkeypatch):
    real = measured.ncu_kernels

    def shifted(path):
        ks = real(path)
        key = "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"
        ks[7]["metrics"] = {**ks[7]["metrics"], key: ks[7]["metrics"][key] * 1.2}
        return ks
    monkeypatch.setattr(measured, "ncu_kernels", shifted)
    with pytest.raises(AssertionError):          # the notebook's cell: rung 6's waiting warps
        _run_stall_cells()
    monkeypatch.setattr(measured, "ncu_kernels", real)
    ns = _run_stall_cells()
    monkeypatch.setattr(measured, "ncu_kernels", shifted)
    with pytest.raises(AssertionError):          # the appendix's warp states
        checks_nb05.stall_details(ns["prof"], checks_nb05.stall_kernels(), ns["profile"],
                                  ns["resident"])


def test_store_widths_reads_the_opcodes():
    sass = ["STG.E.128 desc[UR4][R2.64], R4", "@P0 STG.E.U16 desc[UR4][R6.64], R9",
            "STG.E desc[UR4][R2.64], R5", "STG.E.64 desc[UR4][R2.64], R6", "LDG.E.128 R4, [R2]"]
    widths = load_schedule.store_widths({"sass": sass})
    assert widths == {16: 1, 8: 1, 4: 1, 2: 1} and list(widths) == [16, 8, 4, 2]


@triton.jit
def _stride2_store_kernel(
    x_ptr, y_ptr, freqs_ptr, S, B, H, B_CHUNK,
    stride_xs, stride_xb, stride_xh, stride_xd,
    stride_ys, stride_yb, stride_yh, stride_yd,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
):
    # whole rows in, the members of each pair written back at stride 2: 2-byte stores
    s = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    j = tl.arange(0, BLOCK_HALF)
    m = (h < H)[:, None] & (j < HALF)[None, :]
    for b in range(0, B):
        xo = x_ptr + s * stride_xs + b * stride_xb + h[:, None] * stride_xh
        yo = y_ptr + s * stride_ys + b * stride_yb + h[:, None] * stride_yh
        e = tl.load(xo + (2 * j)[None, :] * stride_xd, mask=m, other=0.0)
        o = tl.load(xo + (2 * j + 1)[None, :] * stride_xd, mask=m, other=0.0)
        tl.store(yo + (2 * j)[None, :] * stride_yd, -o, mask=m)
        tl.store(yo + (2 * j + 1)[None, :] * stride_yd, e, mask=m)


def _ex1_args():
    x = torch.empty(4096, 8, 32, 128, dtype=torch.bfloat16, device="meta")
    bf16, fp32 = torch.empty(16, dtype=torch.bfloat16), torch.empty(16)
    return dict(x_ptr=bf16, y_ptr=bf16, freqs_ptr=fp32, S=4096, B=8, H=32, B_CHUNK=8,
                **dict(zip(("stride_xs", "stride_xb", "stride_xh", "stride_xd"), x.stride())),
                **dict(zip(("stride_ys", "stride_yb", "stride_yh", "stride_yd"), x.stride())),
                HALF=64, BLOCK_HALF=64, BLOCK_S=1, BLOCK_H=32)


def test_exercise_1b_refuses_stride_2_stores_and_passes_the_solution(capsys):
    from ropelib.course.exercises import finished_kernel as fk
    args = _ex1_args()
    assert not checks_nb05.check_wide_stores("stride 2", _stride2_store_kernel, args,
                                             num_warps=8, wide=2)
    assert "2 bytes" in capsys.readouterr().out
    assert checks_nb05.check_wide_stores("solution", fk._rope_interleaved_tile_solution_kernel,
                                         args, num_warps=8, wide=2)


def test_exercise_1b_refuses_a_blank_kernel():

    @triton.jit
    def blank(x_ptr):
        pass
    assert not checks_nb05.check_wide_stores("blank", blank, {}, num_warps=8, wide=2)


# --- the appendices' checks, on the committed runs ------------------------------------------------

def test_the_appendix_claims_hold_on_the_committed_csvs(capsys):
    mech = measured.mechanism("s4096-b8")
    tp, (tp_meta, _) = measured.two_pass(), measured.load("two_pass")
    tab = checks_nb05.table_probe()
    assert list(tab) == ["s4096-b8", "s16384-b8-h8", "s32768-b1", "s16-b64"]
    checks_nb05.opcode_profile(mech)
    checks_nb05.paired_rows_probe()
    checks_nb05.elementwise_route(tp, tp_meta)
    assert "ratio to a copy" in capsys.readouterr().out


def test_a_changed_probe_number_fails_its_check(monkeypatch):
    real = measured.probe

    def shifted(kind, *a, **kw):
        runs = real(kind, *a, **kw)
        if kind == "paired_rows_probe":
            row = runs["bf16 sbhd 1 GiB s16k b8"]["rows=paired"]
            runs["bf16 sbhd 1 GiB s16k b8"]["rows=paired"] = {**row, "ratio_to_copy": 0.91}
        return runs
    monkeypatch.setattr(measured, "probe", shifted)
    with pytest.raises(AssertionError):
        checks_nb05.paired_rows_probe()


# --- the notebook's shared helpers: compile failures, section 3's timing, the flat pass compiled --

def test_compile_failed_says_what_and_why_in_one_line(capsys):
    long = RuntimeError("ptxas\nfailed on " + "x" * 1000 + " the error itself")
    assert checks_nb05.compile_failed(long) is None          # a cell writes `sched = ...(exc)`
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and len(out) < 400
    assert out.startswith("compiling for sm_90 did not work here (RuntimeError: ptxas failed on")
    assert out.rstrip().endswith("the error itself)")       # the compiler's own words, at the end
    checks_nb05.compile_failed(OSError("no cuobjdump"), what="compiling it for sm_90")
    assert capsys.readouterr().out == \
        "compiling it for sm_90 did not work here (OSError: no cuobjdump)\n"


def test_time_rungs_times_every_launch_beside_a_copy(do_bench_stand_in, capsys):
    # 1 ms for the first call (the copy's), then 2 ms
    timed = do_bench_stand_in(lambda k: 1.0 if k == 0 else 2.0).calls
    x = torch.randn(4, 2, 3, 8)
    launched = []
    calls = {"batch_reuse": lambda: launched.append("batch_reuse"),
             "heads": lambda: launched.append("heads")}
    committed = {"batch_reuse": 70.4, "heads": 86.9}
    live = checks_nb05.time_rungs(x, calls, committed, "the H200 run", timed=True)
    assert live == {"batch_reuse": 50.0, "heads": 50.0}
    assert launched == ["batch_reuse", "heads"] and len(timed) == 3    # the copy, then each rung
    out = capsys.readouterr().out
    assert "the H200 run" in out and "+16.5" in out and "+0.0" in out
    assert "the biggest step, live: heads (+0.0 points)" in out
    assert "the biggest step, committed: heads (+16.5 points)" in out
    # without a GPU: nothing timed, nothing launched, the committed column printed
    assert checks_nb05.time_rungs(x, calls, committed, "the H200 run", timed=False) == {}
    out = capsys.readouterr().out
    assert "needs a GPU" in out and "+16.5" in out and len(timed) == 3 and len(launched) == 2
    assert "biggest step, live" not in out


def test_flat_pass_schedule_compiles_ropelibs_pass():
    own = checks_nb05.flat_pass_schedule()
    assert len(own["loads"]) == 10 and all(".128" in ins for _, ins in own["loads"])
    if triton.__version__.startswith(("3.6", "3.9")):       # section 5's profile: 46 registers
        assert own["registers"] == 46 and own["early"] == 8


def test_time_against_copy_without_a_gpu_checks_and_times_nothing(do_bench_stand_in, capsys):
    stand_in = do_bench_stand_in(lambda k: 1.0)
    x = torch.randn(4, 3)
    y, want = torch.empty_like(x), 2 * x
    right = lambda: torch.mul(x, 2, out=y)            # noqa: E731
    assert checks_nb05.time_against_copy(
        x, y, want, yours={"yours": (True, right), "not yet": (False, right)}, solution=right,
        others=[("apply_rope", right)], timed=False) == {}
    out = capsys.readouterr().out
    assert stand_in.calls == [] and "not timed" in out
    assert "yours                      launched here: equal to the reference" in out
    assert "not yet: launched here once it passes its check above" in out
    assert "apply_rope                 timed on a GPU only" in out
    with pytest.raises(AssertionError, match="yours, x \\[4, 3\\]"):     # a wrong launch stops it
        checks_nb05.time_against_copy(x, y, want, yours={"yours": (True, lambda: y.copy_(x))},
                                      solution=None, timed=False)
    capsys.readouterr()
    checks_nb05.not_timed_here((4096, 8, 32, 128), ladder.plan("chunks", 4096, 8, 32, 128, 2,
                                                               SMS_H200, H200_KNOBS),
                               {"ropelib's finished kernel": 0.903}, "the H200 run")
    out = capsys.readouterr().out
    assert out.startswith("Timing needs a GPU. On an H200 this cell times them at x "
                          "[4096, 8, 32, 128] bf16 (grid (4096, 1, 1), BLOCK_S=1 BLOCK_H=32 "
                          "B_CHUNK=8, 8 warps)")
    assert "ropelib's finished kernel" in out and "0.903 of a copy" in out


def _notebook_cell(marker):
    """The one code cell of notebook 05 whose source holds `marker`."""
    import jupytext
    nb = jupytext.read(ROOT / "notebooks" / "05-finished-kernel.py", fmt="py:percent")
    (src,) = [c.source for c in nb.cells if c.cell_type == "code" and marker in c.source]
    return src


def _markdown_after(marker):
    """The markdown cell right after notebook 05's code cell holding `marker`."""
    import jupytext
    nb = jupytext.read(ROOT / "notebooks" / "05-finished-kernel.py", fmt="py:percent")
    cells = [(c.cell_type, c.source) for c in nb.cells]
    (i,) = [i for i, (kind, src) in enumerate(cells) if kind == "code" and marker in src]
    assert cells[i + 1][0] == "markdown"
    return cells[i + 1][1]


def test_rung_6s_b1_step_comes_with_what_the_text_says():
    # section 5, "What the profile says", rung 6's bullet: at b = 1 rung 6 against rung 5 (the
    # cycles profile), 5 % fewer warp instructions, the schedulers issuing in 30 % of their cycles
    # (idle in 70 %), occupancy 22 -> 28 %, warps waiting on a load 2.4 -> 3.3 a scheduler
    b1 = _run_stall_cells()["prof"]["s32768-b1"]
    r5, r6 = b1["accurate"], b1["equal_halves"]
    assert round(100 * (1 - r6["inst_m"] / r5["inst_m"])) == 5
    assert round(100 * r6["issuing"]) == 30 and round(100 * (1 - r6["issuing"])) == 70
    assert [round(r["occupancy"]) for r in (r5, r6)] == [22, 28]
    assert [round(r["waiting_on_memory"] * r["issuing"], 1) for r in (r5, r6)] == [2.4, 3.3]
    text = _markdown_after("WARPS_PER_SCHEDULER = 16")
    for said_ in ("5 % fewer warp instructions", "30 % of their cycles", "occupancy 22 →",
                  "28 %)", "2.4 → 3.3", "idle in 70 %"):
        assert said_ in text, said_


def test_the_best_tiles_of_heads_stop_where_the_text_says():
    # section 5's cell "by batch loop and warps a program", run on the committed mechanism
    # profile: the text reads its best tiles to three digits, 0.867 to 0.915 of a copy
    mech = measured.mechanism("s4096-b8")
    ns = dict(mech=mech, shown=lambda v: v, said=checks_nb05.said,
              planned_m=mech["ropelib_planned"],
              RUNGS_PROFILED=("heads", "tile", "warps", "chunks", "accurate", "equal_halves",
                              "ropelib", "ropelib_planned"))
    exec(compile(_notebook_cell("LOOP_GROUPS = {"), "<section 5's best tiles>", "exec"), ns)  # noqa: S102
    best = ns["best"]
    assert [checks_nb05.said(v) for v in (min(best.values()), max(best.values()))] == \
        ["0.867", "0.915"]
    assert "0.867 to 0.915" in _markdown_after("LOOP_GROUPS = {")


def test_the_pages_live_ladder_lies_inside_the_h100_processes():
    # section 3's paragraph after the timed rungs: on the H100 page, every live step lies inside
    # the range of the ten H100 processes (section 5), to the digit printed; the steps other than
    # the heads and warps rungs' 0.4 of a point or less
    from loading import load_file
    run_notebooks = load_file("run_notebooks", ROOT / "benchmarks" / "run_notebooks.py")
    page = (ROOT / "docs" / "executed" / "05-finished-kernel.html").read_text(encoding="utf-8")
    out = run_notebooks.page_output_text(page)
    assert "live: GPU (NVIDIA H100" in out
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.split() == ["rung", "live", "step",
                                                                       "committed", "step"])
    live = {}
    for line in lines[first + 2:first + 1 + len(ladder.NAMES)]:   # rung, live, step, committed, step
        name, _, step, *_ = line.split()
        live[name] = float(step)
    assert list(live) == list(ladder.NAMES[1:])
    _, runs = measured.load("ladder_runs", "nvidia-h100-80gb-hbm3")
    by_run = ladder.steps_by_run(runs)
    for rung, step in live.items():
        v = by_run["s4096-b8", rung]
        assert round(min(v), 1) <= step <= round(max(v), 1), (rung, step, min(v), max(v))
    assert all(abs(s) <= 0.4 for n, s in live.items() if n not in ("heads", "warps"))
