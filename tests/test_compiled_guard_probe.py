"""benchmarks/compiled_guard_probe.py: the guards Dynamo installs for a compiled ropelib call,
counted and timed beside two graphs that read no ropelib code."""
import re
from pathlib import Path

from loading import load_file

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "compiled_guard_probe.py"


def _load():
    return load_file("compiled_guard_probe", SCRIPT)


def test_ropelib_graph_carries_the_guards_of_the_code_it_traced(monkeypatch, capsys):
    module = _load()
    monkeypatch.setattr("sys.argv", ["compiled_guard_probe.py", "--calls", "20", "--rounds", "1"])
    module.main()
    out = capsys.readouterr().out.splitlines()
    rows = {m.group(1).strip(): (int(m.group(2)), float(m.group(3))) for m in
            (re.match(r"(.{22}) +(\d+) leaf guards +([\d.]+) µs", line) for line in out) if m}
    assert set(rows) == {"q + 0 (q only)", "q * f[0] (q and f)", "ropelib.apply_rope",
                         "ropelib.apply_rope_qk"}
    assert all(us > 0 for _, us in rows.values())
    # the tensors' guards are the same in the last two; ropelib's checks and planning add more
    assert rows["ropelib.apply_rope"][0] > 2 * rows["q * f[0] (q and f)"][0]
    by_function = out[-1]
    assert by_function.startswith("ropelib's leaf guards by the function")
    assert "apply_rope" in by_function and "check_tensor" in by_function
