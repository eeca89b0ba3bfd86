"""benchmarks/eager_python_pieces.py runs every piece it times (with the launches removed) and puts
the launches back."""
from pathlib import Path

from loading import load_file

from ropelib import eager

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "eager_python_pieces.py"


def _load():
    return load_file("eager_python_pieces", SCRIPT)


def test_every_piece_runs_and_the_launches_come_back(monkeypatch, capsys):
    module = _load()
    launch = eager.EagerLaunch.__call__
    monkeypatch.setattr("sys.argv", ["eager_python_pieces.py", "--rounds", "1", "--calls", "2"])
    module.main()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# ") and "launches removed" in out[0]
    timed = {line[:58].strip(): float(line[58:]) for line in out[1:]}
    assert len(timed) == 17 and all(us > 0 for us in timed.values())
    assert "Rotate.backward under no_grad" in timed
    assert eager.EagerLaunch.__call__ is launch            # put back
