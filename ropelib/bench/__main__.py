"""`python -m ropelib.bench --suite {targets,quick,decode,sweep,model,floor} ...`: the benchmark
suites of `ropelib.bench.suite` and `ropelib.bench.floor` (`--help` lists the options)."""
import sys

from .cli import main

if __name__ == "__main__":   # importing this module (e.g. walking the package) runs nothing
    sys.exit(main())
