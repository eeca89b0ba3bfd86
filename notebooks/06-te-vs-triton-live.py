# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 — Transformer Engine vs Triton, live
#
# Notebooks 03–05 built ropelib's kernels one generation at a time. Here we put them side by
# side with everything else that computes RoPE — Transformer Engine's fused CUDA kernel and its
# plain-PyTorch path, eager PyTorch, `torch.compile`, Liger Kernel and flash-attn where they are
# installed — on the *same inputs*, and measure them the way the earlier study projects did,
# only more carefully.
#
# **After this notebook you will be able to**
#
# - run one configuration through every provider and read the row it produces: time, GB/s,
#   the ratio to a plain copy of the same bytes, and the error against an fp64 reference in ulps;
# - say why a memory-bound kernel is judged against a *copy* measured in the same run rather
#   than against the GPU's data-sheet bandwidth;
# - use the dashboard: choose a configuration and providers, sweep one axis, watch the plot and
#   table fill in, export the CSV and PNG;
# - reproduce the sweeps earlier RoPE-in-Triton studies published (GB/s vs sequence length at
#   batch 1, 2, 4, 8 with 64 heads of
#   128; sequence / hidden / heads / batch sweeps of Triton vs TE vs PyTorch) and read the
#   committed GPU results.
#
# On a machine without a GPU everything runs in Triton's interpreter at tiny sizes. The *errors*
# are then real, but the **timings are meaningless** (every Triton program is Python code taking
# milliseconds); every table and figure made here says so. The GPU numbers are the committed
# ones in `benchmarks/results/`.

# %%
import os, torch
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before ropelib (and its @triton.jit) is imported
import ropelib
device = ropelib.default_device()

# %%
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
from IPython.display import HTML, Image, display

from ropelib import compare, runtime, widgets
from ropelib.debug import tolerances

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "ropelib").is_dir())
FIGURES = ROOT / "figures"
RESULTS = ROOT / "benchmarks" / "results"
GPU = runtime.on_gpu()
# The dashboard exports to a scratch folder (ROPELIB_WRITE_FIGURES=1: to figures/, on purpose)
EXPORT_DIR = runtime.figures_dir()
print(runtime.mode())
print("timings:", compare.TIMING_GPU if GPU else compare.TIMING_CPU)

# %% [markdown]
# ## 1. The providers
#
# `compare.providers()` lists every implementation ropelib knows. One that is not installed
# (or cannot run here) is listed with the reason instead of raising, so the same notebook runs
# on a laptop and on an H100 with Transformer Engine.

# %%
provs = compare.providers()
display(HTML("<table><tr><th>provider</th><th>available</th><th>what / why not</th></tr>" +
             "".join(f"<tr><td>{p.name}</td><td>{'✅' if p.available else '—'}</td>"
                     f"<td>{p.description if p.available else p.reason}</td></tr>"
                     for p in provs) + "</table>"))
assert [p.name for p in provs] == list(compare.PROVIDER_NAMES)
assert all(p.available or p.reason for p in provs)

# %% [markdown]
# ## 2. One configuration, every provider
#
# A configuration is a `compare.Config`: sequence length $S$, batch $B$, heads $H$, head
# dimension $D$, dtype, layout (`sbhd`, `bshd`, `thd`), interleaved or rotate-half pairs, the
# rotary fraction and whether sequences start at an offset. `run_case` draws one input, computes
# an fp64 reference, measures a **plain copy of the same bytes** (`y.copy_(x)`), then runs each
# provider:
#
# - **time**: median and 20th/80th percentiles from `triton.testing.do_bench` on a GPU (forward,
#   and forward + backward);
# - **GB/s** from a bytes model. RoPE reads $x$, writes $y$ and reads the fp32 angle table,
#   so with $e$ bytes per element and rotary dimension $R$
#   $$ \text{bytes}_\text{fwd} = 2\,S B H D\, e + 4\, S R, \qquad
#      \text{bytes}_\text{fwd+bwd} = 2\,\text{bytes}_\text{fwd}; $$
# - **ratio to copy** $= t_\text{copy} / t_\text{provider}$: 1.0 means as fast as copying the
#   tensor, the floor for a memory-bound op. A copy measured *in the same run* on the same
#   bytes absorbs clocks, cache sizes and the driver; a data-sheet bandwidth does not;
# - **errors** against the fp64 reference: max absolute, max relative and max error in **ulps**
#   of the output dtype at the reference value (0.5 ulp = correctly rounded).

# %%
if GPU:
    one = compare.Config(seq_len=4096, batch=2, heads=32, head_dim=128, dtype="bf16")
else:
    one = compare.Config(seq_len=8, batch=2, heads=2, head_dim=16, dtype="bf16")
rows = compare.run_case(one, device=device)
display(HTML(widgets.rows_table_html(rows)))

# %%
by = {r["provider"]: r for r in rows}
ok = [r for r in rows if r["available"]]
assert by["pytorch"]["available"] and by["ropelib"]["available"], by["ropelib"]["reason"]
# ropelib computes in fp32 and rounds once: half an ulp, plus the fp32 error that outputs near
# zero (where the two products cancel) can show — never more than one ulp
assert by["ropelib"]["max_ulp_err"] <= 1.0
# eager PyTorch rounds cos/sin and every product to bf16 (TE's unfused path): more ulps
assert by["pytorch"]["max_ulp_err"] > by["ropelib"]["max_ulp_err"]
for r in ok:
    assert r["fwd_ms"] > 0 and r["copy_fwd_ms"] > 0 and r["timing"] == rows[0]["timing"]
print({r["provider"]: round(r["max_ulp_err"], 3) for r in ok})

# %% [markdown]
# Eager PyTorch is several kernels (`cos`, `sin`, casts, two multiplies, a `cat`, an add), each
# reading and writing the whole tensor, and it rounds every intermediate to bf16 — hence more
# ulps. The fused kernels read $x$ once, keep everything in fp32 registers and round once.

# %% [markdown]
# ## 3. The dashboard
#
# The controls set the base configuration; **sweep** picks the axis and **values** its values;
# the provider list picks who runs. **run** sweeps: each row updates the plot (GB/s and % of a
# copy vs the swept axis; forward solid, forward+backward dashed) and the table as it arrives.
# **export** writes the rows (with GPU name, driver, versions and date) as CSV and the plot as
# PNG into `figures/` on a GPU. Every control is a plain attribute, so the cell below can also
# drive it without clicking.

# %%
dash = widgets.Dashboard(device=device, figures_dir=str(EXPORT_DIR))
dash

# %%
# Drive the dashboard from code: the same callback the run button calls.
available = {p.name for p in provs if p.available}
dash.controls["axis"].value = "seq_len"
dash.controls["values"].value = "1024, 2048, 4096, 8192" if GPU else "4, 8, 16"
dash.controls["providers"].value = tuple(
    n for n in ("ropelib", "te_fused", "te_unfused", "pytorch", "torch.compile") if n in available)
dash_rows = dash.run()
csv_path, png_path = dash.export(stem="06-dashboard")
print("exported", csv_path, "and", png_path)
n_values = len(widgets.parse_values(dash.controls["values"].value))
assert len(dash_rows) == len(dash.controls["providers"].value) * n_values
assert all(r["available"] for r in dash_rows if r["provider"] in ("ropelib", "pytorch"))

# %% [markdown]
# ## 4. Sweeps from earlier studies
#
# `compare.SEED_SWEEPS` holds the sweeps that earlier RoPE-in-Triton studies published:
#
# - GB/s vs sequence length 256 … 3840 for batch 1, 2, 4, 8 with `head_num` 64 and `head_dim`
#   128, in fp32 and bf16. The batch-reusing Triton kernel was reported at ~260 GB/s at batch 1
#   and +24 % / +36 % / +44 % at batch 2 / 4 / 8, with TE's CUDA kernel flat near 250 GB/s, on an
#   RTX 2070 Super (448 GB/s peak);
# - sequence-length, hidden-size (head dim), head-count and batch sweeps of Triton fused vs TE
#   fused vs PyTorch unfused (an A100 study: Triton fused edged out TE, both far ahead of eager).
#
# `benchmarks/seed_sweeps.py` runs them all on a GPU and writes
# `benchmarks/results/seed_sweeps.csv` and `figures/06-seed-*.png`. Here we list them and run
# the first, full size on a GPU and shrunk to a few tiny values in the interpreter.

# %%
for s in compare.SEED_SWEEPS:
    print(f"{s.name:16s} {s.axis:8s} {list(s.values)[:4]}{'...' if len(s.values) > 4 else ''}"
          f"  base S={s.base.seq_len} B={s.base.batch} H={s.base.heads} D={s.base.head_dim}"
          f" {s.base.dtype}")

# %%
first = compare.SEED_SWEEPS[0] if GPU else compare.shrink(compare.SEED_SWEEPS[0])
names = [n for n in first.providers if n in {p.name for p in provs if p.available}]
live = compare.sweep(first.base, first.axis, first.values, names, device=device)
fig, ax = plt.subplots(figsize=(6, 3.6))
compare.plot_sweep(live, first.axis, ax=ax, title=f"{first.name}: forward GB/s")
plt.show()
assert {r["provider"] for r in live} == set(names)

# %% [markdown]
# ## 5. The committed GPU results
#
# These come from GPU runs of `benchmarks/seed_sweeps.py`: fp32 in `seed_sweeps.csv` and bf16
# in `seed_sweeps-bf16.csv`, each with its own header (GPU, driver, torch/triton/TE versions,
# date), so each panel says where it was measured. A missing file is said, never made up, and a
# panel with no measurement stops the notebook.

# %%
sweep_csvs = {"fp32": RESULTS / "seed_sweeps.csv", "bf16": RESULTS / "seed_sweeps-bf16.csv"}
for dtype, path in sweep_csvs.items():
    if not path.exists():
        print(f"{path.relative_to(ROOT)} is not there: its GPU results have not been committed. "
              "Run `python benchmarks/seed_sweeps.py` on a GPU.")
        continue
    meta = compare.read_meta(path)
    gpu_rows = [r for r in compare.read_csv(path)
                if r["timing"] == compare.TIMING_GPU and r["dtype"] == dtype]
    assert gpu_rows, f"{path.name} holds no {dtype} GPU timings"
    where = f"{meta.get('gpu')}, TE {meta.get('transformer_engine')}, {meta.get('date')}"
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.4), sharey=True)
    for ax, b in zip(axes, (1, 2, 4, 8)):
        sub = [r for r in gpu_rows if r["sweep"] == f"seq_len-b{b}-{dtype}"]
        assert sub, f"{path.name}: no seq_len sweep at batch {b} in {dtype}: an empty panel"
        compare.plot_sweep(sub, "seq_len", ax=ax, title=f"{dtype}, batch {b}")
    fig.suptitle(where, fontsize=9)
    plt.show()
    for b in (1, 8):
        sub = {r["provider"]: r for r in gpu_rows
               if r["sweep"] == f"seq_len-b{b}-{dtype}" and r["seq_len"] == 3840}
        assert sub, f"{path.name}: no {dtype} batch {b} measurement at S=3840"
        print(f"{dtype} batch {b}, S=3840 ({meta.get('gpu')}):",
              {k: round(v["fwd_gbps"]) for k, v in sub.items() if v["fwd_gbps"]})
for png in sorted(FIGURES.glob("06-seed-*.png")):
    print(png.name)
    display(Image(filename=str(png), width=800))
# every committed result file, with where and when it was measured
for path in sorted(RESULTS.glob("*.csv")):
    m = compare.read_meta(path)
    print(f"{path.name}: {len(compare.read_csv(path))} rows, GPU {m.get('gpu', '?')}, "
          f"TE {m.get('transformer_engine', '?')}, {m.get('date', '?')}")

# %% [markdown]
# ## What we saw
#
# - Every provider runs on the same inputs; one that cannot run says why.
# - Speed is stated as GB/s *and* as a fraction of a copy measured in the same run; correctness
#   as ulps against fp64. The fused kernels round once (≤ 0.5 ulp); eager PyTorch rounds every
#   intermediate.
# - Interpreter timings are meaningless; the GPU numbers are the committed ones. Notebook 07
#   takes up the other half of those studies' story: the `allclose` that failed.
