"""A file of this checkout loaded as a module: the benchmark scripts and notebooks' helper files
the tests exercise, and test modules whose helpers other tests share (their folders are no
packages). Imported by the test modules as `from loading import load_file` (pytest puts tests/
on the path)."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_file(name: str, path):
    """The module `name` executed from `path` (a str or Path), not registered in sys.modules."""
    spec = importlib.util.spec_from_file_location(name, str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
