"""Notebook 05 (the finished kernel): its ladder is ropelib.course.ladder's, the last rung is ropelib's
kernel bit for bit, benchmarks/ladder.py checks every rung and draws its waterfall, the layout
can be read without a GPU, and the kernel exercise rejects the known cheats."""
import math
import os
import re
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import ropelib  # noqa: E402
from ropelib import reference, runtime  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.course import ladder  # noqa: E402
from ropelib.course.exercises import finished_kernel as fk  # noqa: E402
from loading import learner_copy, load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "05-finished-kernel"
LADDER_KERNELS = ["ropelib.course.ladder._ladder_heads_kernel",
                  "ropelib.course.ladder._ladder_tile_kernel",
                  "ropelib.course.ladder._ladder_chunk_kernel",
                  "ropelib.course.ladder._ladder_final_kernel"]


@pytest.fixture(scope="module")
def bench():
    return load_file("ladder_bench", ROOT / "benchmarks" / "ladder.py")


@pytest.fixture(scope="module")
def same():
    return load_file("kernels_same", ROOT / "tests" / "test_notebook_kernels_same.py")


# --- one ladder: the notebook's cells, ropelib.course.ladder, the benchmark ------------------------------

@pytest.mark.parametrize("ext", [".py", ".ipynb"])
def test_notebook_runs_the_ladder_kernels_of_ropelib(same, ext):
    cells = same.notebook_cells(NOTEBOOK.with_suffix(ext))
    shown = dict(same.shown_sources(cells))
    assert set(LADDER_KERNELS) <= set(shown), "every ladder kernel is a runnable cell"
    for name in LADDER_KERNELS:
        assert shown[name] == same.source_of(name), f"{name}: the notebook's copy is stale"
    code = [t for k, t in cells if k == "code"]
    for name in LADDER_KERNELS:
        short = name.rsplit(".", 1)[1]
        defined = next(i for i, t in enumerate(code) if f"def {short}(" in t)
        # the launch is the learner's: a later cell launches the notebook's copy itself, with a
        # grid and tile constants it computes, and compares with the measured rung
        launches = [t for t in code[defined + 1:] if re.search(rf"\b{short}\[grid\]\(", t)]
        assert launches, f"no cell launches the notebook's {short}"
        launch = launches[0]
        assert "grid = (" in launch and "triton.cdiv(" in launch
        assert "BLOCK_HALF=" in launch and "num_warps=num_warps" in launch
        assert "ladder.rope_ladder(" in launch, f"{short}: compared with the measured rung"
    # no cell hands the editable kernel to ropelib's launcher: its launch is in the notebook
    assert not any(re.search(r"rope_ladder\([^)]*kernel=", t) for t in code)
    joined = "\n".join(code)
    assert "benchmarks\" / \"ladder.py" in joined or "benchmarks/ladder.py" in joined


def test_rope_ladder_launches_only_its_own_kernels():
    import inspect
    assert "kernel" not in inspect.signature(ladder.rope_ladder).parameters


def test_benchmark_times_ropelibs_ladder(bench):
    assert bench.ladder is ladder
    assert bench.PROVIDERS == ("copy",) + ladder.NAMES + ("ropelib", "ropelib_planned")
    assert {ladder.KERNELS[r] for r in ladder.NAMES[1:]} == {n.rsplit(".", 1)[1] for n in LADDER_KERNELS}


# --- correctness -----------------------------------------------------------------------------------

def _x(S, B, H, D, dtype, strided, seed=0):
    gen = torch.Generator().manual_seed(seed)
    if strided:   # a bshd tensor seen as sbhd, every other feature
        return torch.randn(B, S, H, 2 * D, generator=gen).to(dtype).permute(1, 0, 2, 3)[..., ::2]
    return torch.randn(S, B, H, D, generator=gen).to(dtype)


SHAPES = [(5, 3, 3, 24, torch.bfloat16, False), (4, 2, 5, 16, torch.float16, True),
          (3, 5, 2, 32, torch.float32, False), (7, 1, 4, 8, torch.bfloat16, True)]


@pytest.mark.parametrize("S, B, H, D, dtype, strided", SHAPES)
def test_last_rung_equals_ropelib_bit_for_bit(S, B, H, D, dtype, strided):
    x = _x(S, B, H, D, dtype, strided)
    freqs = compare.angles(S + 3, D)                 # more rows than tokens
    theirs = ropelib.apply_rope(x, freqs[:S], layout="sbhd")
    mine = ladder.rope_ladder("equal_halves", x, freqs)
    assert torch.equal(mine, theirs)
    free = torch.rand(S, D, generator=torch.Generator().manual_seed(1)) * 6 - 3
    assert torch.equal(ladder.rope_ladder("equal_halves", x, free),
                       ropelib.apply_rope(x, free.view(S, 1, 1, D), layout="sbhd"))


@pytest.mark.parametrize("S, B, H, D, dtype, strided", SHAPES)
@pytest.mark.parametrize("rung", ladder.NAMES)
def test_every_rung_matches_the_reference_with_gpu_plans(rung, S, B, H, D, dtype, strided):
    # the plans a GPU with 132 SMs would use (chunks, small tiles with masked tails), run here
    x = _x(S, B, H, D, dtype, strided)
    freqs = torch.rand(S, D, generator=torch.Generator().manual_seed(2)) * 6 - 3
    tiles = None if rung == "batch_reuse" else ladder.plan(rung, S, B, H, D, x.element_size(), 132)
    y = torch.full((S, B, H, D), float("nan"), dtype=dtype)
    ladder.rope_ladder(rung, x, freqs, out=y, tiles=tiles)
    want = reference.rope_reference(x.double(), freqs)
    # 16-bit: one rounding of fp32 math; fp32: fp32 arithmetic is a few ulps of the head
    assert compare.error_metrics(y, want)["max_head_ulp_err"] <= (4.0 if dtype == torch.float32 else 1.0)


def test_gpu_plans_follow_ropelibs_planner():
    from ropelib.kernels import launch
    for S, B, H in ((4096, 8, 32), (16, 64, 32), (32768, 1, 32), (16384, 8, 8)):
        p = ladder.plan("equal_halves", S, B, H, 128, 2, 132)
        bs, bh, chunk, warps = launch.pick_tiles(S, B, (H,), 128, 128, 2, 132)
        assert (p.block_s, p.block_h, p.chunk, p.num_warps) == (bs, bh, chunk, warps)
        assert p.grid == (triton.cdiv(S, bs), triton.cdiv(H, bh), triton.cdiv(B, chunk))
    # rungs 2 and 3 differ in the warps only; the tile spans tokens when heads are few
    t, w = ladder.plan("tile", 16384, 8, 8, 128, 2, 132), ladder.plan("warps", 16384, 8, 8, 128, 2, 132)
    assert (t.block_s, t.block_h, t.grid) == (w.block_s, w.block_h, w.grid) == (4, 8, (4096, 1))
    assert (t.num_warps, w.num_warps) == (4, 16)
    # chunks split a batch of 64 over 16 tokens; the rungs before cannot
    assert ladder.plan("warps", 16, 64, 32, 128, 2, 132).grid == (16, 1)
    assert ladder.plan("chunks", 16, 64, 32, 128, 2, 132).grid == (16, 1, 64)


# --- the benchmark ---------------------------------------------------------------------------------

def test_dry_run_checks_every_rung_and_writes_a_readable_csv(bench, tmp_path, capsys):
    out = tmp_path / "ladder.csv"
    assert bench.main(["--dry-run", "--out", str(out)]) == 0
    rows, meta = compare.read_csv(out), compare.read_meta(out)
    assert meta["script"] == "benchmarks/ladder.py" and "dry run" in meta["timing"]
    assert {r["case"] for r in rows} == {"tiny", "tiny-b1"}
    assert [r["provider"] for r in rows if r["case"] == "tiny"] == list(bench.PROVIDERS)
    for r in rows:
        if r["provider"] == "copy":
            continue
        assert r["available"] is True, (r["case"], r["provider"], r["reason"])
        assert 0 <= r["max_head_ulp_err"] <= 1.0 and r["ms"] is None
    assert [r["bit_equal_ropelib"] for r in rows if r["provider"] == "equal_halves"] == [True, True]
    assert "failed" not in capsys.readouterr().out


def test_a_wrong_rung_is_caught(bench, monkeypatch):
    original = ladder.rope_ladder

    def broken(rung, x, freqs, **kw):
        y = original(rung, x, freqs, **kw)
        return y.roll(1, dims=-1) if rung == "warps" else y
    monkeypatch.setattr(bench.ladder, "rope_ladder", broken)
    rows = bench.run(dry_run=True, progress=False)
    bad = [r for r in rows if r["provider"] == "warps"]
    assert bad and all(r["available"] is False and "differs" in r["reason"] for r in bad)
    assert all(r["available"] for r in rows if r["provider"] == "tile")


def test_timing_needs_a_gpu(bench):
    if torch.cuda.is_available():
        pytest.skip("on a GPU the real run is allowed")
    with pytest.raises(SystemExit):
        bench.run(dry_run=False, progress=False)
    with pytest.raises(SystemExit):   # the committed CSV never receives dry-run rows
        bench.main(["--dry-run", "--out", str(bench.CSV_PATH)])


def test_waterfall_is_drawn_from_a_csv(bench, tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    pct = {"batch_reuse": 80.0, "heads": 90.0, "tile": 89.0, "warps": 94.0, "chunks": 94.5,
           "accurate": 93.0, "equal_halves": 96.0, "ropelib": 96.5, "ropelib_planned": 98.0}
    rows = []
    for case, b in (("s4096-b8", 8), ("s32768-b1", 1)):
        for step, p in enumerate(bench.PROVIDERS):
            r = dict(case=case, seq_len=4096 * 8 // b, batch=b, heads=32, head_dim=128,
                     dtype="bf16", provider=p, step=step, idea="", available=True, reason="")
            v = 100.0 if p == "copy" else pct[p] - (5.0 if b == 1 else 0.0)
            r.update(ms=1.0 / v, ms_p20=0.99 / v, ms_p80=1.01 / v, gbps=30.0 * v,
                     copy_gbps=3000.0, pct_of_copy=v)
            rows.append(r)
    path = tmp_path / "synthetic.csv"
    bench.write(rows, path)
    back = compare.read_csv(path)
    png = tmp_path / "waterfall.png"
    fig = bench.plot_waterfall(back, png)
    assert png.exists() and png.stat().st_size > 10_000
    axes = [a for a in fig.axes if a.patches]
    assert len(axes) == 2
    assert all(len(a.patches) == len(bench.PROVIDERS) - 1 for a in axes)   # the copy is a line
    tops = [round(max(p.get_y() + p.get_height(), p.get_y()), 6) for p in axes[0].patches]
    assert tops[0] == 80.0 and tops[1] == 90.0
    with pytest.raises(ValueError, match="no timed rows"):
        bench.plot_waterfall([dict(r, pct_of_copy=None) for r in back])
    assert "05-" in bench.FIGURE_PATH.name and bench.FIGURE_PATH.parent.name == "figures"


def _timed_rows(spread):
    """Synthetic ladder rows of one case; `spread`: {provider: (p20 factor, p80 factor)}."""
    pct = {"batch_reuse": 80.0, "heads": 90.0, "tile": 89.8, "warps": 94.0, "chunks": 94.5,
           "accurate": 93.0, "equal_halves": 96.0, "ropelib": 96.5, "ropelib_planned": 98.0}
    rows = []
    for step, p in enumerate(("copy",) + tuple(pct)):
        v = 100.0 if p == "copy" else pct[p]
        lo, hi = spread.get(p, (0.995, 1.005))
        rows.append(dict(case="s4096-b8", seq_len=4096, batch=8, heads=32, head_dim=128,
                         provider=p, step=step, ms=1.0 / v, ms_p20=lo / v, ms_p80=hi / v,
                         pct_of_copy=v))
    return rows


def test_the_notebooks_waterfall_draws_every_timings_spread(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    rows = _timed_rows({"tile": (0.99, 1.01), "chunks": (0.9, 1.3)})
    r_chunks = next(r for r in rows if r["provider"] == "chunks")
    lo, hi = ladder.pct_range(r_chunks)           # the slow calls pull the low end down
    assert lo == pytest.approx(94.5 / 1.3) and hi == pytest.approx(94.5 / 0.9)
    # tile: a 0.2-point step inside a 1.8-point range; chunks: a 0.5-point step inside ~33
    assert ladder.within_spread(rows, "s4096-b8") == ["tile", "chunks"]
    fig = ladder.plot_waterfall(rows, tmp_path / "w.png",
                                names={"ropelib": "finished kernel (forced)"})
    (ax,) = [a for a in fig.axes if a.patches]
    assert len(ax.patches) == len(rows) - 1                      # the copy is the dashed line
    hatched = [i for i, bar in enumerate(ax.patches) if bar.get_hatch()]
    assert hatched == [2, 4]                                     # tile and chunks
    whiskers = [l for l in ax.lines if len(set(l.get_xdata())) == 1]
    assert len(whiskers) == len(rows) - 1                        # one per bar
    assert "finished kernel (forced)" in [t.get_text() for t in ax.get_xticklabels()]
    assert (tmp_path / "w.png").stat().st_size > 10_000


def test_the_in_flight_plot_numbers_every_variant_once():
    import matplotlib
    matplotlib.use("Agg")
    from ropelib.course import measured
    mech = measured.mechanism("s4096-b8")
    groups = [("copy", "k", {"copy": "copy"}),
              ("the rest", "tab:blue", {v: v for v in mech if v != "copy"})]
    fig = ladder.plot_in_flight(mech, groups, title="t")
    numbers = [t.get_text() for a in fig.axes[:2] for t in a.texts]
    assert sorted(numbers, key=int) == [str(i) for i in range(1, len(mech) + 1)]
    key = [t.get_text() for t in fig.axes[2].texts]
    assert key[0] == "copy" and key[1].split() == ["1", "copy"] and len(key) == len(mech) + 2


# --- the layout, read from a compilation for sm_90 -------------------------------------------------

def test_the_compiled_layout_of_the_finished_tile():
    warps, final = ladder.compile_for_gpu(["warps", "ropelib"])
    for c in (warps, final):
        assert c["tile"] == {"BLOCK_S": 1, "BLOCK_H": 32, "B_CHUNK": 8} and c["num_warps"] == 16
        x_layout = next(l for l in c["layouts"] if l["sizePerThread"] == [1, 1, 4])
        assert x_layout["warpsPerCTA"] == [1, 16, 1] and x_layout["order"] == [2, 1, 0]
        assert x_layout["threadsPerWarp"][0] * x_layout["threadsPerWarp"][1] \
            * x_layout["threadsPerWarp"][2] == 32
        assert c["accesses"].get("ld.v2.b32", 0) >= 2 and c["accesses"].get("st.v2.b32", 0) >= 2
        assert c["registers"] is None or 16 <= c["registers"] <= 255
    (h200,) = ladder.compile_for_gpu("ropelib", knobs={"tile_loop": (16, 8)})
    assert h200["num_warps"] == 8
    assert any(l["sizePerThread"] == [1, 1, 8] for l in h200["layouts"])
    assert h200["accesses"].get("st.v4.b32", 0) >= 2     # 16-byte stores of bf16


def test_the_flat_pass_compiles_to_the_tile_section_6_reads():
    # section 6 sets the flat pass beside the finished kernel: 1,024 elements (8 head rows of
    # 128) on 2 warps (paired_rows_probe's best on the H200), both members of a pair in one
    # thread: x_j and x_{j+R/2} as one 16-byte vector each, and the fp32 table's cos and s' of
    # both members (eviction-hinted loads, counted too)
    from ropelib.kernels import tiles
    (flat,) = ladder.compile_for_gpu(["two-pass"])
    assert flat["tile"] == {"XBLOCK": tiles.TWO_PASS_ELEMENTS} and tiles.TWO_PASS_ELEMENTS == 1024
    assert flat["num_warps"] == tiles.TWO_PASS_PAIR_WARPS == 2
    assert flat["accesses"].get("ld.v4.b32", 0) == 10      # 2 of x, 8 of the fp32 table
    (h200,) = ladder.compile_for_gpu("ropelib", knobs={"tile_loop": (16, 8)})
    assert flat["registers"] is None or h200["registers"] is None \
        or flat["registers"] < h200["registers"]


# --- the notebook's text ---------------------------------------------------------------------------

@pytest.mark.parametrize("ext", [".py", ".ipynb"])
def test_every_heading_is_in_a_markdown_cell(same, ext):
    # a missing `# %% [markdown]` marker turns a section's text into comments of a code cell
    for kind, text in same.notebook_cells(NOTEBOOK.with_suffix(ext)):
        if kind == "code":
            stray = [l for l in text.splitlines() if re.match(r"#+ #{1,4} ", l)]
            assert not stray, f"headings inside a code cell: {stray}"
    headings = [l for kind, t in same.notebook_cells(NOTEBOOK.with_suffix(ext)) if kind == "markdown"
                for l in t.splitlines() if re.match(r"## \d\. ", l)]
    assert [h.split(".")[0] for h in headings] == [f"## {n}" for n in range(1, 7)], headings


def test_section_6_reads_the_h200_runs():
    # section 6 and its appendix (the two-pass route's details, after the exercises)
    text = NOTEBOOK.with_suffix(".py").read_text(encoding="utf-8")
    section = text.split("## 6. Past the finished kernel")[1].split("## Exercise")[0] \
        + text.split("## Appendix: the two-pass route's details")[1].split("## Questions")[0]
    # ... with the checks_nb05 functions those cells call, which read runs for them
    import inspect
    from ropelib.course import checks_nb05
    called = sorted(set(re.findall(r"checks_nb05\.(\w+)\(", section)))
    assert "elementwise_route" in called
    section += "".join(inspect.getsource(getattr(checks_nb05, name)) for name in called)
    assert "measured.two_pass()" in section           # two_pass-nvidia-h200.csv
    assert 'ladder.compile_for_gpu(["two-pass"])' in section
    # the H200's runs only: the H100's two_pass run predates the pass of pairs, so it is not
    # set beside them; the earlier H200 run is, dated
    assert '"nvidia-h100-80gb-hbm3"' not in section
    assert 'measured.two_pass(measured.GPU + "-20261128-0853")' in section
    assert "still to be made" not in section and "on an **H100**" not in section


def test_section_4_compiles_with_the_h200s_tile():
    # the layouts the page shows are the H200's; the H100's tile is compiled only beside them
    text = NOTEBOOK.with_suffix(".py").read_text(encoding="utf-8")
    assert 'H200_KNOBS = dict(tile_loop=tiles.TILES_BY_GPU["NVIDIA H200"]["loop"]' in text
    section = text.split("## 4. How Triton lays")[1].split("## 5. Measured")[0]
    main = re.search(r"compiled = ladder\.compile_for_gpu\((.*?)\)\n", section, re.S)
    assert main and "knobs=H200_KNOBS" in main[1] and "sm_count=SMS_H200" in main[1]
    assert 'compiled_h100 = ladder.compile_for_gpu(["ropelib"])' in section
    assert "H100's tile" in section and "for comparison" in section


# --- the exercise ----------------------------------------------------------------------------------

@triton.jit
def _body(x_ptr, y_ptr, freqs_ptr, S, B, H, B_CHUNK, sxs, sxb, sxh, sxd, sys_, syb, syh, syd,
          HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_S: tl.constexpr,
          BLOCK_H: tl.constexpr, ROTATE_HALF: tl.constexpr, FULL_BLOCKS_ONLY: tl.constexpr,
          NO_B_LIMIT: tl.constexpr, CONTIGUOUS_Y: tl.constexpr, COPY: tl.constexpr,
          STORE: tl.constexpr):
    """The interleaved solution with switches that each plant one known mistake."""
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    b_lo = tl.program_id(2) * B_CHUNK
    if NO_B_LIMIT:
        b_hi = b_lo + B_CHUNK          # runs past B in the last chunk
    else:
        b_hi = tl.minimum(b_lo + B_CHUNK, B)
    j = tl.arange(0, BLOCK_HALF)
    s_lim = S
    if FULL_BLOCKS_ONLY:
        s_lim = (S // BLOCK_S) * BLOCK_S   # the partial last block of tokens is skipped
    m = ((s < s_lim)[:, None] & (h < H)[None, :])[:, :, None] & (j < HALF)[None, None, :]
    tab_m = (s < S)[:, None, None] & (j < HALF)[None, None, :]
    if ROTATE_HALF:
        da = j
        db = j + HALF
    else:
        da = 2 * j
        db = 2 * j + 1
    f = freqs_ptr + s[:, None, None] * (2 * HALF)
    ta = tl.load(f + da[None, None, :], mask=tab_m, other=0.0)
    tb = tl.load(f + db[None, None, :], mask=tab_m, other=0.0)
    if CONTIGUOUS_Y:      # ignores y's strides
        syd2 = 1
        syh2 = 2 * HALF
        syb2 = H * 2 * HALF
        sys2 = B * H * 2 * HALF
    else:
        syd2 = syd
        syh2 = syh
        syb2 = syb
        sys2 = sys_
    for b in range(b_lo, b_hi):
        xr = x_ptr + s[:, None, None] * sxs + b * sxb + h[None, :, None] * sxh
        yr = y_ptr + s[:, None, None] * sys2 + b * syb2 + h[None, :, None] * syh2
        xa = tl.load(xr + da[None, None, :] * sxd, mask=m, other=0.0).to(tl.float32)
        xb = tl.load(xr + db[None, None, :] * sxd, mask=m, other=0.0).to(tl.float32)
        if COPY:
            ya = xa
            yb = xb
        else:
            ya = xa * tl.cos(ta) - xb * tl.sin(ta)
            yb = xb * tl.cos(tb) + xa * tl.sin(tb)
        if STORE:
            tl.store(yr + da[None, None, :] * syd2, ya.to(y_ptr.dtype.element_ty), mask=m)
            tl.store(yr + db[None, None, :] * syd2, yb.to(y_ptr.dtype.element_ty), mask=m)


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """The mistakes as @triton.jit kernels with the exercise's signature, in their own module."""
    import sys
    import types
    folder = tmp_path_factory.mktemp("variants")
    body = types.ModuleType("tests_exercise_body")
    body._body = _body
    sys.modules["tests_exercise_body"] = body
    made = {}
    for label, sw in {"solution-like": {}, "rotate_half": dict(ROTATE_HALF=True),
                      "skips_tail": dict(FULL_BLOCKS_ONLY=True),
                      "chunk_past_b": dict(NO_B_LIMIT=True),
                      "contiguous_y": dict(CONTIGUOUS_Y=True), "copies_input": dict(COPY=True),
                      "writes_nothing": dict(STORE=False)}.items():
        args = ", ".join(f"{k}={v}" for k, v in dict(
            dict(ROTATE_HALF=False, FULL_BLOCKS_ONLY=False, NO_B_LIMIT=False,
                 CONTIGUOUS_Y=False, COPY=False, STORE=True), **sw).items())
        src = ("import triton\nimport triton.language as tl\n"
               "from tests_exercise_body import _body\n\n\n@triton.jit\n"
               "def kernel(x_ptr, y_ptr, freqs_ptr, S, B, H, B_CHUNK, sxs, sxb, sxh, sxd, sys_,\n"
               "           syb, syh, syd, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,\n"
               "           BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr):\n"
               "    _body(x_ptr, y_ptr, freqs_ptr, S, B, H, B_CHUNK, sxs, sxb, sxh, sxd, sys_, syb,\n"
               f"          syh, syd, HALF, BLOCK_HALF, BLOCK_S, BLOCK_H, {args})\n")
        file = folder / f"variant_{label.replace('-', '_')}.py"
        file.write_text(src)
        made[label] = load_file(f"variant_{label.replace('-', '_')}", file).kernel
    yield made
    del sys.modules["tests_exercise_body"]


def test_the_exercise_accepts_an_own_copy_of_the_solution(capsys):
    own = learner_copy(fk._rope_interleaved_tile_solution_kernel)
    assert fk.check_interleaved_tile_kernel(own) is True
    assert fk.check_interleaved_tile_kernel(own, seed=5)
    assert "✅" in capsys.readouterr().out


def test_the_exercise_refuses_the_worked_solution(capsys):
    assert fk.check_interleaved_tile_kernel(fk._rope_interleaved_tile_solution_kernel) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ interleaved 3-D tile kernel: this exercise wants your interleaved "
                          "3-D tile kernel, but the answer launched ropelib's "
                          "_rope_interleaved_tile_solution_kernel"), out


def test_the_planted_mistakes_harness_is_sound(variants):
    # without a mistake, the switched kernel passes: the rejections below are the mistakes'
    assert fk.check_interleaved_tile_kernel(variants["solution-like"], seed=3) is True


@pytest.mark.parametrize("label, why", [
    ("rotate_half", "entries differ"), ("skips_tail", "not written"),
    ("chunk_past_b", "outside the output"), ("contiguous_y", ""),
    ("copies_input", "entries differ"), ("writes_nothing", "not written")])
def test_the_exercise_rejects_known_mistakes(variants, label, why, capsys):
    assert fk.check_interleaved_tile_kernel(variants[label], seed=3) is False
    out = capsys.readouterr().out
    assert "❌" in out and why in out


def test_the_exercise_rejects_answers_that_are_not_kernels(capsys):
    def returns_reference(x, freqs):
        return reference.rope_reference(x, freqs, interleaved=True)

    class HostKernel(triton.runtime.KernelInterface):
        """Looks like a kernel, computes the reference on the host and writes it into y."""
        def __getitem__(self, grid):
            def run(x, y, freqs, *args, **kwargs):
                y.copy_(reference.rope_reference(x, freqs, interleaved=True))
            return run

    @triton.jit
    def blank(x_ptr, y_ptr, freqs_ptr, S, B, H, B_CHUNK, sxs, sxb, sxh, sxd, sys_, syb, syh, syd,
              HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_S: tl.constexpr,
              BLOCK_H: tl.constexpr):
        pass  # your code

    for answer in (returns_reference, HostKernel(), blank, None, ...):
        assert fk.check_interleaved_tile_kernel(answer) is False
    out = capsys.readouterr().out
    assert out.count("❌") == 5 and "no answer yet" in out and "@triton.jit" in out


def test_the_exercise_signature_is_the_notebooks():
    text = NOTEBOOK.with_suffix(".py").read_text(encoding="utf-8")
    assert fk.KERNEL_SIGNATURE.strip() in text
    # the answer is not shown or imported before the exercise
    before = text.split("def my_interleaved_tile_kernel")[0]
    assert "_rope_interleaved_tile_solution_kernel" not in before and "show_solution" not in before


# --- the exercises' GPU timing cells, run here on a small input -------------------------------

TIMED_HERE = (5, 3, 4, 64)          # a small sbhd shape the interpreter runs in well under a second


@triton.jit
def _copies_x(x_ptr, y_ptr, cos_ptr, sin_ptr, N, ROW, D: tl.constexpr, XBLOCK: tl.constexpr):
    # Exercise 2's signature, and a wrong answer: y = x
    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < N), mask=i < N)


def _timing_cells(same):
    code = [t for k, t in same.notebook_cells(NOTEBOOK.with_suffix(".py")) if k == "code"]
    return [next(t for t in code if f"def time_exercise_{n}(" in t) for n in (1, 2, 3)]


@pytest.fixture()
def timing(same, do_bench_stand_in, capsys):
    """The three timing cells run as the notebook runs them here (GPU False), with what the
    notebook defines before them: the learner's kernels are copies of the worked solutions, each
    has passed its check; `do_bench` calls its function once and says 1 ms for the first call
    (the copy's) and 2 ms for every later one (`timed_without_gpu`: the calls while the cells ran,
    `timed`: the calls after)."""
    from ropelib.course import checks_nb05, measured
    from ropelib.course.exercises import flat_pass, pairs_pass
    from ropelib.kernels import tiles

    import ropelib
    from ropelib.bench.routes import forced
    h200_knobs = dict(tile_loop=tiles.TILES_BY_GPU["NVIDIA H200"]["loop"],
                      tile_noloop=tiles.TILE_NOLOOP, tile_wide=tiles.TILE_WIDE)
    ns = dict(torch=torch, triton=triton, tl=tl, ropelib=ropelib, device=runtime.default_device(),
              GPU=False, forced=forced, checks_nb05=checks_nb05, measured=measured,
              SMS_H200=132, H200_KNOBS=h200_knobs,
              runtime=runtime, ladder=ladder, reference=reference, fk=fk, flat_pass=flat_pass,
              pairs_pass=pairs_pass, tiles=tiles,
              my_interleaved_tile_kernel=learner_copy(fk._rope_interleaved_tile_solution_kernel),
              my_interleaved_vector_kernel=learner_copy(fk._rope_interleaved_tile_solution_kernel),
              my_flat_rope_kernel=learner_copy(flat_pass._rope_flat_solution_kernel),
              my_pairs_kernel=learner_copy(pairs_pass._rope_pairs_solution_kernel),
              ex1_passed=True, ex1b_passed=True, ex2_passed=True, ex3_passed=True)
    ns["timed_without_gpu"] = do_bench_stand_in(lambda k: 1.0).calls
    printed = []
    for cell in _timing_cells(same):
        exec(compile(cell, "<timing cell>", "exec"), ns)  # noqa: S102 -- the notebook's cells
        printed.append(capsys.readouterr().out)
    ns["printed_without_gpu"] = printed
    ns["timed"] = do_bench_stand_in(lambda k: 1.0 if k == 0 else 2.0).calls
    return ns


@pytest.mark.parametrize("n, yours, committed", [
    (1, ("Exercise 1", "Exercise 1b"), ("finished kernel (rotate-half pairs)", "0.903",
                                       "apply_rope (two passes, rotate-half pairs)", "0.997")),
    (2, ("Exercise 2",), ("element-wise flat pass (A.9's rows=fp32)", "0.968")),
    (3, ("Exercise 3",), ("both members in one thread (A.9's pairs per thread)", "0.993"))])
def test_without_a_gpu_a_timing_cell_checks_your_launch_and_says_what_a_gpu_times(
        timing, n, yours, committed):
    out = timing["printed_without_gpu"][n - 1]
    assert timing["timed_without_gpu"] == []                     # nothing timed
    assert f"x {list(timing['CHECKED_SHAPE'])} bfloat16" in out and "not timed" in out
    for e in yours + ("worked solution",):
        name = e if e == "worked solution" else f"yours ({e})"
        assert re.search(rf"{re.escape(name)}\s+launched here: equal to the reference", out), name
    assert "Timing needs a GPU. On an H200 this cell times them at x [4096, 8, 32, 128]" in out
    for text in committed:
        assert text in out, text
    assert timing["TIMED_SHAPE"] == (4096, 8, 32, 128)      # bf16: the 256 MiB the text names
    assert math.prod(timing["TIMED_SHAPE"]) * 2 == 256 << 20


def test_without_a_gpu_a_wrong_launch_fails_the_cell(timing):
    timing["my_flat_rope_kernel"] = _copies_x
    with pytest.raises(AssertionError, match=r"yours \(Exercise 2\), x \[5, 3, 4, 64\]"):
        timing["time_exercise_2"](timing["CHECKED_SHAPE"], timed=False)


@pytest.mark.parametrize("n, yours", [(1, ("Exercise 1", "Exercise 1b")), (2, ("Exercise 2",)),
                                      (3, ("Exercise 3",))])
def test_a_timing_cell_times_your_kernels_beside_the_solution_and_a_copy(timing, n, yours,
                                                                        capsys):
    timing[f"time_exercise_{n}"](TIMED_HERE)
    out = capsys.readouterr().out
    assert f"x {list(TIMED_HERE)} bfloat16" in out
    lines = [line for line in out.splitlines() if "of a copy" in line]
    names = [line.split("  ")[1].strip() for line in lines]
    first = ["y.copy_(x)"] + [f"yours ({e})" for e in yours] + ["worked solution"]
    if n == 1:   # apply_rope as planned beside them, then the finished kernel, its route forced
        first.append("apply_rope (two passes)")         # for the whole of its own timing
        assert names == first + ["y.copy_(x)", "ropelib's finished kernel"]
    else:
        assert names == first
    assert lines[0].endswith("1.00 of a copy")
    assert all(line.endswith("0.50 of a copy") for line in lines[1:len(first)])
    assert len(timing["timed"]) == len(lines)


def test_a_kernel_that_has_not_passed_its_check_is_not_timed(timing, capsys):
    timing["ex2_passed"] = False
    timing["time_exercise_2"](TIMED_HERE)
    out = capsys.readouterr().out
    assert "yours (Exercise 2): timed here once it passes its check above" in out
    assert "worked solution" in out and len(timing["timed"]) == 2      # the copy, the solution


def test_a_kernel_wrong_at_the_timed_size_stops_the_cell(timing):
    timing["my_flat_rope_kernel"] = _copies_x
    with pytest.raises(AssertionError, match=r"yours \(Exercise 2\), x \[5, 3, 4, 64\]"):
        timing["time_exercise_2"](TIMED_HERE)
    assert timing["timed"] == []                  # nothing timed before the assert


def test_the_timing_cells_launch_your_kernel_in_the_cell(same):
    # the launch the learner edits is in the notebook, not in the exercise module's launcher
    for n, cell in enumerate(_timing_cells(same), 1):
        assert re.search(r"\bkernel\[(grid|\(triton\.cdiv\()", cell), n
        assert not re.search(r"\b(fk|flat_pass|pairs_pass)\.launch\(", cell), n
        assert "if GPU:" in cell and "time_against_copy(" in cell, n
        assert "timed=False" in cell and "not_timed_here(" in cell, n   # the CPU's path
    # the timing itself: do_bench, in the cell or in the helper the cell imports
    import inspect
    from ropelib.course import checks_nb05
    assert "do_bench(" in _timing_cells(same)[0] or (
        "checks_nb05 import against_committed, time_against_copy" in _timing_cells(same)[0]
        and "do_bench(" in inspect.getsource(checks_nb05.time_against_copy))


def test_the_waterfall_can_hatch_a_step_inside_both_ends_spreads(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    # warps: a 4.2-point step whose own range is narrow but whose rung before (tile) is wide
    rows = _timed_rows({"tile": (0.97, 1.03)})
    steps = {r["provider"]: r["pct_of_copy"] for r in rows}
    rung_only = ladder.within_spread(rows, "s4096-b8")
    both = ladder.within_both_spreads(rows, "s4096-b8")
    assert set(rung_only) <= set(both)                       # stricter: every step hatched before
    assert "warps" in both and "warps" not in rung_only
    for name in both:
        prev = ladder.NAMES[ladder.NAMES.index(name) - 1]
        a, b = (next(r for r in rows if r["provider"] == n) for n in (prev, name))
        width = sum(hi - lo for lo, hi in (ladder.pct_range(a), ladder.pct_range(b)))
        assert width > abs(steps[name] - steps[prev])
    fig = ladder.plot_waterfall(rows, tmp_path / "w.png", unclear_rule=ladder.within_both_spreads)
    (ax,) = [a for a in fig.axes if a.patches]
    hatched = [rows_drawn for rows_drawn, bar in enumerate(ax.patches) if bar.get_hatch()]
    assert len(hatched) == len(both)
    assert "spreads at its two ends" in fig._suptitle.get_text()


def test_the_ladder_is_timed_as_the_notebook_launches_it(same):
    # section 3's timing launches the learner's launch functions (which launch the notebook's
    # kernels), not ropelib's ladder; section 5 times the notebook's rung 6 beside the copy
    code = [t for k, t in same.notebook_cells(NOTEBOOK.with_suffix(".py")) if k == "code"]
    (cell,) = [t for t in code if "checks_nb05.time_rungs(" in t]
    calls = cell.split("RUNG_CALLS = {")[1].split("\n}\n")[0]
    for launcher in ("launch_batch_reuse(", "launch_heads(", "launch_tile(", "launch_chunks(",
                     "launch_final("):
        assert launcher in calls, launcher
    assert "rope_ladder" not in cell and "timed=GPU" in cell
    defined = [t for t in code if re.search(r"^def launch_(batch_reuse|heads|tile|chunks|final)\(",
                                            t, re.M)]
    assert len(defined) == 5 and all(re.search(r"\b_\w+_kernel\[grid\]\(", t) for t in defined)
    (copy_cell,) = [t for t in code if "def copy_on_tile(" in t]
    assert "launch_final(x_c, f_c" in copy_cell and "rope_ladder" not in copy_cell
