"""ropelib.course.widgets driven headlessly: set a control's value, call the callback, check the output."""
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("matplotlib")

from ropelib.bench import compare  # noqa: E402
from ropelib.course import debug, widgets  # noqa: E402


def test_dashboard_run_produces_rows_plot_and_table(tmp_path, device):
    dash = widgets.Dashboard(providers=["pytorch", "torch.compile"], device=device)
    dash.controls["seq_len"].value = 4
    dash.controls["batch"].value = 2
    dash.controls["heads"].value = 2
    dash.controls["head_dim"].value = 16
    dash.controls["dtype"].value = "fp32"
    dash.controls["axis"].value = "batch"
    dash.controls["values"].value = "1, 2"
    dash.controls["backward"].value = False
    rows = dash.run()
    assert len(rows) == 4 and dash.rows == rows
    assert [r["batch"] for r in rows] == [1, 1, 2, 2]
    assert all(r["seq_len"] == 4 and r["dtype"] == "fp32" for r in rows)
    ok = [r for r in rows if r["provider"] == "pytorch"]
    assert all(r["available"] and r["fwd_gbps"] > 0 for r in ok)
    assert dash.progress.value == dash.progress.max == 4
    assert dash.plot.value[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<td>pytorch</td>" in dash.table.value
    assert dash.table.value.count("<tr>") == 1 + 4
    axes = dash.figure.axes
    assert axes[0].get_xlabel() == "batch" and axes[0].get_ylabel() == "GB/s"
    assert axes[1].get_ylabel() == "% of copy"
    line = axes[0].lines[0]
    assert list(line.get_xdata()) == [1, 2]
    assert list(line.get_ydata()) == pytest.approx([r["fwd_gbps"] for r in ok])
    # the figure names what measured it: this GPU, or the CPU interpreter
    where = widgets.measured_on(rows)
    if str(device).startswith("cuda"):
        import torch
        assert where == torch.cuda.get_device_name(device)
    else:
        assert where == widgets.CPU_INTERPRETER
    assert dash.figure.get_suptitle() == f"measured on {where}"

    csv_path, png_path = dash.export(str(tmp_path), "dash")
    back = compare.read_csv(csv_path)
    assert [r["provider"] for r in back] == [r["provider"] for r in rows]
    assert open(png_path, "rb").read(4) == b"\x89PNG"


def _gpu_row(provider, seq_len, gbps):
    return {"provider": provider, "seq_len": seq_len, "available": True, "fwd_gbps": gbps,
            "ratio_fwd": gbps / 4000, "device": "cuda", "timing": compare.TIMING_GPU}


def test_sweep_figure_names_the_gpu_of_a_committed_csv(tmp_path):
    """Rows read back from a result CSV are drawn with the GPU its header names, never with
    the machine that draws them."""
    rows = [_gpu_row("ropelib", s, g) for s, g in ((1024, 1800.0), (2048, 2200.0))]
    path = compare.write_csv(rows, tmp_path / "sweep.csv", meta={"gpu": "NVIDIA H200"})
    meta, back = compare.read_meta(path), compare.read_csv(path)
    assert widgets.measured_on(back, meta) == "NVIDIA H200"
    fig = widgets.draw_sweep(back, "seq_len", where=widgets.measured_on(back, meta))
    assert fig.get_suptitle() == "measured on NVIDIA H200"
    # a CPU run's header says gpu: none, and its rows say interpreter timing
    cpu = [dict(r, device="cpu", timing=compare.TIMING_CPU) for r in rows]
    assert widgets.measured_on(cpu, {"gpu": "none"}) in (widgets.CPU_INTERPRETER, "CPU")
    assert "meaningless" in widgets.draw_sweep(cpu, "seq_len").axes[0].get_title()


def test_dashboard_reports_bad_values_without_raising(device):
    dash = widgets.Dashboard(providers=["pytorch"], device=device)
    dash.controls["values"].value = "4, eight"
    assert dash.run() == []
    assert "comma-separated integers" in dash.status.value
    with pytest.raises(ValueError, match="run a sweep first"):
        dash.export()


def test_interpreter_caps_the_sizes_and_says_so():
    """On the CPU the sliders stop where a run still takes seconds; a sweep past a cap is refused
    with the cap named; on a GPU nothing is capped."""
    assert widgets.size_caps("cuda") == {}
    dash = widgets.Dashboard(providers=["pytorch"], device="cpu")
    for name, cap in widgets.INTERPRETER_CAPS.items():
        options = dash.controls[name].options
        assert max(options) == cap, (name, options)
    assert "capped at seq_len 64" in dash.status.value
    dash.controls["axis"].value = "heads"
    dash.controls["values"].value = "2, 64"
    assert dash.run() == []
    assert "heads is capped at 8" in dash.status.value


def test_parse_values_and_table():
    assert widgets.parse_values("4, 8;16") == [4, 8, 16]
    with pytest.raises(ValueError, match="values"):
        widgets.parse_values("0, 2")
    html = widgets.rows_table_html([{"provider": "<x>", "fwd_ms": 1.23456789}])
    assert "&lt;x&gt;" in html and "1.235" in html


def test_toggle_panel_follows_the_checkboxes(device):
    panel = widgets.TogglePanel(debug.Scenario(seq_len=16, batch=2, heads=2, head_dim=16),
                                device=device)
    first = panel.diagnosis
    assert first["first_ten_equal"] and not first["allclose"]      # the reported failure
    assert "False" in panel.summary.value
    assert panel.heatmap.value[:4] == b"\x89PNG"

    panel.set_causes(debug.FIXED)
    panel.tolerance.value = "dtype"          # the observer re-runs the comparison
    assert panel.diagnosis["allclose"]
    assert "True" in panel.summary.value

    panel.checkboxes["sbhd_row_indexing"].value = True
    d = panel.diagnosis
    assert not d["allclose"] and d["max_abs_diff"] > 0.1
    assert panel.causes().sbhd_row_indexing
    # sbhd rows s*B + b read position (s*B + b) % S: batch 1 of position 0 is wrong already
    assert panel.figure.axes[0].images[0].get_array()[0].max() > 0.01
    panel.checkboxes["sbhd_row_indexing"].value = False
    panel.checkboxes["te_freqs_reshaped"].value = True   # position p gets p // 2's angles
    assert not panel.diagnosis["allclose"]
    # the heatmap marks the argmax and shows position x feature
    ax = panel.figure.axes[0]
    assert ax.get_ylabel() == "position" and ax.get_xlabel() == "feature (dim)"
    img = ax.images[0].get_array()
    assert img.shape == (16, 16)
    floor = ax.images[0].norm.vmin                  # zeros are drawn at the log scale's floor
    assert float(img[0].max()) <= floor < float(img.max())   # position 0: no difference
