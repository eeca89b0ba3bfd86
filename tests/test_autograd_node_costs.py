"""benchmarks/autograd_node_costs.py times every variant (the launches removed) and puts the
launches back."""
from pathlib import Path

from loading import load_file

from ropelib import eager

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "autograd_node_costs.py"


def test_every_variant_runs_and_the_launches_come_back(monkeypatch, capsys):
    module = load_file("autograd_node_costs", SCRIPT)
    launch = eager.EagerLaunch.__call__
    monkeypatch.setattr("sys.argv", ["autograd_node_costs.py", "--rounds", "1", "--calls", "2"])
    module.main()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# ") and "launches removed" in out[0]
    rows = {line[:52].strip(): line[52:].split() for line in out[1:]}
    assert len(rows) == 31
    assert "eager.Rotate, reads saved for backward (as it was)" in rows
    assert "eager.Rotate, reads kept on ctx (now)" in rows
    assert eager.EagerLaunch.__call__ is launch            # put back
