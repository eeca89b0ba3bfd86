"""benchmarks/tile_sweep.py and noloop_knob_probe.py on the CPU: ladder.copy_on_plan copies,
the rotation agrees with the rung's own plan on every launch it would time, and the launches
stay within the elements-a-thread bounds the docstring names."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

from pathlib import Path  # noqa: E402

from loading import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_the_sweep_checks_its_kernels_on_small_shapes(capsys):
    sweep = load_file("tile_sweep", ROOT / "benchmarks" / "tile_sweep.py")
    assert sweep.main(["--check"]) == 0
    assert "the tile copy copies" in capsys.readouterr().out


def test_the_sweep_launches_cover_the_grid_and_stay_in_bounds():
    sweep = load_file("tile_sweep", ROOT / "benchmarks" / "tile_sweep.py")
    for S, B, H, D in sweep.SHAPES.values():
        plans = sweep.launches(S, B, H, D)
        assert plans and len(set(plans)) == len(plans)
        for p in plans:
            assert 2 <= p.block_s * p.block_h * D / (32 * p.num_warps) <= 64
            assert p.grid == (-(-S // p.block_s), -(-H // p.block_h), -(-B // p.chunk))
            assert p.chunk <= B


def test_the_knob_probe_sets_a_known_knob():
    probe = load_file("noloop_knob_probe", ROOT / "benchmarks" / "noloop_knob_probe.py")
    from ropelib.kernels import tiles
    assert probe.SETTINGS[0] == tiles.TILE_NOLOOP          # the shipped setting is the control
    assert all(len(s) == 2 for s in probe.SETTINGS)


def test_notebook_05_shows_the_copy_kernel_the_sweep_times():
    """Notebook 05's editable `_copy_on_tile_kernel` is, as committed, the kernel
    `ladder.copy_on_plan` launches (benchmarks/tile_sweep.py times that one on many launches)."""
    import ast
    import inspect

    from ropelib.course import ladder
    text = (ROOT / "notebooks" / "05-finished-kernel.py").read_text(encoding="utf-8")
    (node,) = [n for n in ast.parse(text).body
               if isinstance(n, ast.FunctionDef) and n.name == "_copy_on_tile_kernel"]
    shown = "\n".join(text.splitlines()[node.decorator_list[0].lineno - 1:node.end_lineno])
    assert shown == inspect.getsource(ladder._copy_on_tile_kernel.fn).rstrip("\n")
