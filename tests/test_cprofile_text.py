"""ropelib.course.cprofile_text: reading a cProfile text dump (notebook 07's host profile)."""
from pathlib import Path

import pytest

from ropelib.course.cprofile_text import entry, read_profile

ROOT = Path(__file__).resolve().parents[1]

DUMP = """\
         1000 function calls (990 primitive calls) in 0.250 seconds

   Ordered by: internal time

   ncalls  tottime  percall  cumtime  percall filename:lineno(function)
      300    0.100    0.000    0.200    0.001 /home/me/src/ropelib/ropelib/eager.py:282(run)
   310/300    0.050    0.000    0.060    0.000 /opt/venv/lib/python3.12/site-packages/torch/_tensor.py:576(backward)
      300    0.010    0.000    0.240    0.001 /home/me/src/ropelib/benchmarks/host_profile.py:40(step)
"""


def test_names_lose_the_prefix_of_wherever_the_dump_was_written(tmp_path):
    path = tmp_path / "profile.txt"
    path.write_text(DUMP)
    total, tables = read_profile(path)
    assert total == 0.25
    assert list(tables) == ["internal time"]
    own = tables["internal time"]
    assert list(own) == ["ropelib/eager.py:282(run)", "torch/_tensor.py:576(backward)",
                         "benchmarks/host_profile.py:40(step)"]
    assert own["torch/_tensor.py:576(backward)"] == {"ncalls": 310, "tottime": 0.05,
                                                     "cumtime": 0.06}
    assert entry(own, "ropelib/eager.py", "(run)")["cumtime"] == 0.2
    with pytest.raises(LookupError):
        entry(own, ".py")                       # three functions match, not one


def test_the_committed_profiles_name_their_functions_from_the_package():
    paths = sorted((ROOT / "benchmarks" / "results").glob("host-profile-*.txt"))
    assert paths
    for path in paths:
        total, tables = read_profile(path)
        assert total > 0 and tables, path.name
        for table in tables.values():
            for name in table:
                assert not name.startswith("/"), (path.name, name)
