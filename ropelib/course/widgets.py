"""ipywidgets front ends for notebooks 07 (live TE-vs-Triton dashboard) and 08 (allclose toggles).

The logic lives in plain functions (:func:`draw_sweep`, :func:`rows_table_html`,
:func:`toggle_result`, ...) and in the methods the widgets call (:meth:`Dashboard.run`,
:meth:`TogglePanel.update`), so tests drive them headlessly: set a control's ``value`` and call
the callback. ipywidgets and matplotlib are imported when a panel is built, not at import time.
"""
from __future__ import annotations

import dataclasses
import html
import io
import os
from typing import Optional

from .. import runtime
from ..bench import compare

AXES = ("seq_len", "batch", "heads", "head_dim")
TABLE_COLUMNS = ("provider", "seq_len", "batch", "heads", "head_dim", "dtype", "fwd_ms",
                 "fwd_gbps", "ratio_fwd", "fwdbwd_ms", "fwdbwd_gbps", "ratio_fwdbwd",
                 "max_ulp_err", "max_head_ulp_err", "reason")
# In the CPU interpreter every kernel program runs as Python (a few ms each): the dashboard's
# sizes stop here, where one case with every provider takes a few seconds.
INTERPRETER_CAPS = {"seq_len": 64, "batch": 4, "heads": 8, "head_dim": 64}


# --- plain functions --------------------------------------------------------------------------

def default_sizes(device=None) -> dict:
    """Dashboard defaults: full sizes on a GPU, tiny ones for the CPU interpreter."""
    dev = str(device or runtime.default_device())
    if dev.startswith("cuda"):
        return {"seq_len": 2048, "batch": 2, "heads": 32, "head_dim": 128,
                "values": "512, 1024, 2048, 4096, 8192"}
    return {"seq_len": 8, "batch": 1, "heads": 2, "head_dim": 16, "values": "4, 8, 16"}


def size_caps(device=None) -> dict:
    """The largest value of each size control: none on a GPU, :data:`INTERPRETER_CAPS` on the CPU."""
    dev = str(device or runtime.default_device())
    return {} if dev.startswith("cuda") else dict(INTERPRETER_CAPS)


def parse_values(text: str) -> list:
    """"4, 8, 16" -> [4, 8, 16]; a clear error naming the field otherwise."""
    try:
        vals = [int(v) for v in str(text).replace(";", ",").split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"values must be comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise ValueError(f"values must be positive integers, got {text!r}")
    return vals


def rows_table_html(rows, columns=TABLE_COLUMNS) -> str:
    """An HTML table of result rows (numbers to 4 significant digits)."""
    def fmt(v):
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:.4g}"
        return html.escape(str(v))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{fmt(r.get(c))}</td>" for c in columns) + "</tr>"
                   for r in rows)
    return (f"<table class='ropelib-rows' style='font-size:11px'><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>")


CPU_INTERPRETER = "CPU (Triton interpreter)"


def measured_on(rows, meta: Optional[dict] = None) -> str:
    """What measured ``rows``: the GPU a result CSV's header names (``meta``, from
    :func:`compare.read_meta`); else, for rows measured here, the CUDA device's name
    (``torch.cuda.get_device_name``) or :data:`CPU_INTERPRETER` for interpreter timings."""
    gpu = (meta or {}).get("gpu")
    if gpu not in (None, "", "none"):
        return str(gpu)
    rows = list(rows)
    if not rows:
        return "nothing yet (no rows)"
    if any(r.get("timing") == compare.TIMING_CPU for r in rows):
        return CPU_INTERPRETER if runtime.INTERPRET else "CPU"
    import torch
    devices = sorted({str(r.get("device") or "cuda") for r in rows})
    names = sorted({torch.cuda.get_device_name(d) for d in devices if d.startswith("cuda")
                    and torch.cuda.is_available()})
    if not names:
        raise ValueError(f"rows timed on {devices}, whose name cannot be read here: pass the "
                         "CSV header's meta")
    return ", ".join(names)


def draw_sweep(rows, axis: str, backward: bool = True, where: Optional[str] = None):
    """A figure with GB/s and % of copy vs ``axis`` (forward solid; forward+backward dashed).

    The figure's title names what measured the rows: ``where``, else :func:`measured_on`."""
    import matplotlib
    from matplotlib.figure import Figure
    rows = list(rows)
    where = where or measured_on(rows)
    fig = Figure(figsize=(10, 3.9))
    ax1, ax2 = fig.subplots(1, 2)
    series = {}
    for r in rows:
        if not r.get("available") or r.get("fwd_gbps") is None:
            continue
        s = series.setdefault(r["provider"], {"x": [], "gbps": [], "pct": [], "gbps_b": [],
                                              "pct_b": []})
        s["x"].append(r[axis])
        s["gbps"].append(r["fwd_gbps"])
        s["pct"].append(100 * r["ratio_fwd"])
        s["gbps_b"].append(r.get("fwdbwd_gbps"))
        s["pct_b"].append(None if r.get("ratio_fwdbwd") is None else 100 * r["ratio_fwdbwd"])
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, s) in enumerate(sorted(series.items())):
        c = colors[i % len(colors)]
        ax1.plot(s["x"], s["gbps"], "o-", color=c, label=f"{name} fwd")
        ax2.plot(s["x"], s["pct"], "o-", color=c, label=f"{name} fwd")
        if backward and all(v is not None for v in s["gbps_b"]):
            ax1.plot(s["x"], s["gbps_b"], "s--", color=c, label=f"{name} fwd+bwd")
            ax2.plot(s["x"], s["pct_b"], "s--", color=c, label=f"{name} fwd+bwd")
    cpu = any(r.get("timing") == compare.TIMING_CPU for r in rows)
    note = " (CPU interpreter: timings meaningless)" if cpu else ""
    ax1.set(xlabel=axis, ylabel="GB/s", title="bandwidth" + note)
    ax2.set(xlabel=axis, ylabel="% of copy", title="speed as % of a plain copy" + note)
    ax2.axhline(100, color="gray", lw=0.8, ls=":")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.title.set_fontsize(9)
        if series:
            ax.legend(fontsize=7)
    fig.suptitle(f"measured on {where}", fontsize=10)
    fig.tight_layout()
    return fig


def figure_png(fig, dpi: int = 100) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def toggle_result(causes, scenario=None, tolerance: str = "default", device=None):
    """Run notebook 08's story with ``causes``; returns (diagnosis dict, heatmap figure)."""
    from matplotlib.figure import Figure
    from . import debug
    scenario = scenario or debug.Scenario()
    res = debug.reproduce(scenario, causes, device=device)
    diag = debug.diagnose(res, tolerance)
    fig = Figure(figsize=(5.5, 3.8))
    ax = fig.subplots()
    debug.plot_heatmap(debug.error_map(res.tokens_te, res.tokens_triton, res.layout), ax=ax,
                       title=f"|{res.te_label} - Triton| (max over batch, heads)")
    loc = diag["argmax"]
    ax.plot([loc["dim"]], [loc["position"]], "c+", ms=14, mew=2)
    fig.tight_layout()
    return diag, fig


def summary_html(diag: dict) -> str:
    ok = "✅ True" if diag["allclose"] else "❌ False"
    loc = diag["argmax"]
    return (f"<div class='ropelib-summary'>"
            f"<b>torch.allclose({html.escape(diag['te'])}, Triton, rtol={diag['rtol']:g}, "
            f"atol={diag['atol']:g})</b>: {ok} "
            f"({diag['n_mismatched']} of {diag['numel']} elements differ)<br>"
            f"first ten values equal: {diag['first_ten_equal']}<br>"
            f"max |difference| = {diag['max_abs_diff']:.4g} at position {loc['position']}, "
            f"batch {loc['batch']}, head {loc['head']}, dim {loc['dim']} "
            f"({loc['a']:.4g} vs {loc['b']:.4g})<br>"
            f"error vs fp64: {html.escape(diag['te'])} {diag['te_max_ulp']:.3g} ulp, "
            f"Triton {diag['triton_max_ulp']:.3g} ulp; within dtype tolerance of fp64: "
            f"{diag['te_matches_fp64']} / {diag['triton_matches_fp64']}</div>")


# --- notebook 07: the dashboard ---------------------------------------------------------------

class Dashboard:
    """Configuration controls, a provider set, a run button, a live plot and a table.

    ``run()`` (the button's callback) sweeps ``axis`` over ``values``; each arriving row
    updates :attr:`rows`, the plot and the table. ``export()`` writes CSV + PNG.
    """

    def __init__(self, providers=None, device=None, figures_dir: str = "figures",
                 stem: str = "07-dashboard"):
        import ipywidgets as W
        self.device = device or runtime.default_device()
        self.figures_dir, self.stem = figures_dir, stem
        self.rows: list = []
        self.figure = None
        sizes = default_sizes(self.device)
        self.caps = size_caps(self.device)

        def pow2(name, lo, hi):
            return [2 ** i for i in range(lo, hi + 1) if 2 ** i <= self.caps.get(name, 2 ** hi)]
        self.controls = {
            "seq_len": W.SelectionSlider(options=pow2("seq_len", 2, 15), value=sizes["seq_len"],
                                         description="seq_len"),
            "batch": W.SelectionSlider(options=pow2("batch", 0, 6), value=sizes["batch"],
                                       description="batch"),
            "heads": W.SelectionSlider(options=pow2("heads", 0, 7), value=sizes["heads"],
                                       description="heads"),
            "head_dim": W.SelectionSlider(options=pow2("head_dim", 3, 8), value=sizes["head_dim"],
                                          description="head_dim"),
            "dtype": W.Dropdown(options=list(compare.DTYPES), value="bf16", description="dtype"),
            "layout": W.Dropdown(options=list(compare.LAYOUTS), value="sbhd",
                                 description="layout"),
            "interleaved": W.Checkbox(value=False, description="interleaved"),
            "rotary_percent": W.Dropdown(options=[1.0, 0.5, 0.25], value=1.0,
                                         description="rotary %"),
            "start_positions": W.Checkbox(value=False, description="start_positions"),
            "axis": W.Dropdown(options=list(AXES), value="seq_len", description="sweep"),
            "values": W.Text(value=sizes["values"], description="values"),
            "backward": W.Checkbox(value=True, description="fwd+bwd"),
        }
        provs = compare.providers()
        self._providers = {p.name: p for p in provs}
        options = [(f"{p.name}" if p.available else f"{p.name} (unavailable)", p.name)
                   for p in provs]
        wanted = providers or [n for n in ("ropelib", "te_fused", "te_unfused", "pytorch",
                                           "torch.compile") if self._providers[n].available]
        self.controls["providers"] = W.SelectMultiple(options=options, value=tuple(wanted),
                                                      rows=min(9, len(options)),
                                                      description="providers")
        self.run_button = W.Button(description="run", button_style="primary", icon="play")
        self.export_button = W.Button(description="export CSV + PNG", icon="save")
        self.progress = W.IntProgress(value=0, min=0, max=1, description="progress")
        self.status = W.HTML()
        self.plot = W.Image(format="png")
        self.table = W.HTML()
        self.run_button.on_click(self.run)
        self.export_button.on_click(lambda _: self.export())
        unavailable = [f"{p.name}: {p.reason}" for p in provs if not p.available]
        self.status.value = (f"<small>{html.escape(runtime.mode())}" +
                             (" — timings are wall-clock in the interpreter: meaningless; sizes "
                              "capped at " + ", ".join(f"{k} {v}" for k, v in self.caps.items()) +
                              " so that a run takes seconds" if self.caps else "") +
                             "<br>unavailable: " + html.escape("; ".join(unavailable)) +
                             "</small>")
        c = self.controls
        self.widget = W.VBox([
            W.HBox([W.VBox([c["seq_len"], c["batch"], c["heads"], c["head_dim"]]),
                    W.VBox([c["dtype"], c["layout"], c["rotary_percent"], c["interleaved"],
                            c["start_positions"]]),
                    W.VBox([c["axis"], c["values"], c["backward"], c["providers"]])]),
            W.HBox([self.run_button, self.export_button, self.progress]),
            self.status, self.plot, self.table])

    def _ipython_display_(self):
        from IPython.display import display
        display(self.widget)

    # the values the callbacks read
    def config(self) -> compare.Config:
        c = self.controls
        return compare.Config(
            seq_len=c["seq_len"].value, batch=c["batch"].value, heads=c["heads"].value,
            head_dim=c["head_dim"].value, dtype=c["dtype"].value, layout=c["layout"].value,
            interleaved=c["interleaved"].value, rotary_percent=float(c["rotary_percent"].value),
            start_positions=c["start_positions"].value)

    def selected_providers(self) -> list:
        return [self._providers[n] for n in self.controls["providers"].value]

    def on_row(self, row: dict) -> None:
        """Called as each row arrives: redraw the plot and the table."""
        self.rows.append(row)
        self.progress.value = min(self.progress.max, self.progress.value + 1)
        self.redraw()

    def redraw(self) -> None:
        axis = self.controls["axis"].value
        self.figure = draw_sweep(self.rows, axis, self.controls["backward"].value)
        self.plot.value = figure_png(self.figure, dpi=80)
        self.table.value = rows_table_html(self.rows)

    def run(self, _button=None) -> list:
        """The run button: sweep the chosen axis over the values with the chosen providers."""
        self.rows = []
        try:
            values = parse_values(self.controls["values"].value)
            axis = self.controls["axis"].value
            cap = self.caps.get(axis)
            if cap is not None and max(values) > cap:
                raise ValueError(f"values: {axis} is capped at {cap} in the CPU interpreter "
                                 f"(a run must take seconds there), got {max(values)}")
            base = self.config()
            provs = self.selected_providers()
            if not provs:
                raise ValueError("choose at least one provider")
            self.progress.max = len(values) * len(provs)
            self.progress.value = 0
            self.run_button.disabled = True
            compare.sweep(base, self.controls["axis"].value, values, provs, progress=False,
                          on_row=self.on_row, backward=self.controls["backward"].value,
                          device=self.device)
        except ValueError as e:
            self.status.value = f"<b style='color:#b00'>{html.escape(str(e))}</b>"
            return []
        finally:
            self.run_button.disabled = False
        self.status.value = (f"{len(self.rows)} rows ({self.rows[0]['timing']} timing on "
                             f"{html.escape(self.rows[0]['device'])})")
        return self.rows

    def export(self, directory: Optional[str] = None, stem: Optional[str] = None):
        """Write ``<stem>.csv`` (with :func:`compare.environment_meta`) and ``<stem>.png``."""
        if not self.rows:
            raise ValueError("nothing to export: run a sweep first")
        directory = directory or self.figures_dir
        stem = stem or self.stem
        os.makedirs(directory, exist_ok=True)
        csv_path = compare.write_csv(self.rows, os.path.join(directory, f"{stem}.csv"),
                                     meta=compare.environment_meta())
        png_path = os.path.join(directory, f"{stem}.png")
        (self.figure or draw_sweep(self.rows, self.controls["axis"].value)).savefig(png_path,
                                                                                   dpi=100)
        self.status.value = f"wrote {html.escape(csv_path)} and {html.escape(png_path)}"
        return csv_path, png_path


# --- notebook 08: the cause toggles -----------------------------------------------------------

class TogglePanel:
    """One checkbox per cause (:class:`ropelib.course.debug.Causes`); every change re-runs the story and
    shows ``allclose``, the max error and the heatmap."""

    def __init__(self, scenario=None, causes=None, device=None):
        import ipywidgets as W
        from . import debug
        self._debug = debug
        self.device = device
        self.scenario = scenario or debug.Scenario()
        start = causes or debug.REPRO
        self.checkboxes = {
            f.name: W.Checkbox(value=getattr(start, f.name), description=debug.CAUSE_DOCS[f.name],
                               layout=W.Layout(width="560px"), style={"description_width": "0px"})
            for f in dataclasses.fields(debug.Causes)}
        self.tolerance = W.ToggleButtons(options=[("allclose defaults", "default"),
                                                  ("dtype-aware", "dtype")], value="default",
                                         description="tolerance")
        self.dtype = W.Dropdown(options=list(compare.DTYPES), value=self.scenario.dtype,
                                description="dtype")
        self.layout = W.Dropdown(options=["sbhd", "bshd"], value=self.scenario.layout,
                                 description="layout")
        self.repro_button = W.Button(description="the reported failure")
        self.fixed_button = W.Button(description="all causes fixed")
        self.summary = W.HTML()
        self.heatmap = W.Image(format="png")
        self.diagnosis: Optional[dict] = None
        self.figure = None
        for w in [*self.checkboxes.values(), self.tolerance, self.dtype, self.layout]:
            w.observe(self.update, names="value")
        self.repro_button.on_click(lambda _: self.set_causes(debug.REPRO))
        self.fixed_button.on_click(lambda _: self.set_causes(debug.FIXED))
        self.widget = W.HBox([
            W.VBox([W.HTML("<b>causes</b> (checked = present)"), *self.checkboxes.values(),
                    self.tolerance, W.HBox([self.dtype, self.layout]),
                    W.HBox([self.repro_button, self.fixed_button])]),
            W.VBox([self.summary, self.heatmap])])
        self._muted = False
        self.update()

    def _ipython_display_(self):
        from IPython.display import display
        display(self.widget)

    def causes(self):
        return self._debug.Causes(**{k: cb.value for k, cb in self.checkboxes.items()})

    def set_causes(self, causes) -> dict:
        self._muted = True
        try:
            for k, cb in self.checkboxes.items():
                cb.value = getattr(causes, k)
        finally:
            self._muted = False
        return self.update()

    def update(self, _change=None) -> Optional[dict]:
        """Re-run the comparison with the checked causes (every control's callback)."""
        if self._muted:
            return None
        sc = dataclasses.replace(self.scenario, dtype=self.dtype.value, layout=self.layout.value)
        self.diagnosis, self.figure = toggle_result(self.causes(), sc, self.tolerance.value,
                                                    self.device)
        self.summary.value = summary_html(self.diagnosis)
        self.heatmap.value = figure_png(self.figure, dpi=80)
        return self.diagnosis
