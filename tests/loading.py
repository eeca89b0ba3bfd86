"""A file of this checkout loaded as a module: the benchmark scripts and notebooks' helper files
the tests exercise, and test modules whose helpers other tests share (their folders are no
packages); and source a test writes (a learner's kernel, a worked solution typed in again, a
notebook's cell) run from a file of its own (`written_module`). Imported by the test modules as
`from loading import load_file` (pytest puts tests/ on the path)."""
import atexit
import importlib.util
import shutil
import sys
import tempfile
import types
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def scratch_folder(prefix: str) -> Path:
    """A new temporary folder for the files a test module writes, removed when the test process
    ends. Not removed at the module's teardown: pytest-xdist may hand a worker more of a module's
    tests after it has run another module and torn this one down."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def load_file(name: str, path):
    """The module `name` executed from `path` (a str or Path), not registered in sys.modules."""
    spec = importlib.util.spec_from_file_location(name, str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def written_module(name: str, path, source: str, names: dict = None):
    """`source` written to `path` (a str or Path) and run from there as the module `name`, not
    registered in sys.modules: code in a file of its own, as a learner's notebook cell has it
    (Triton and inspect read its lines back from the file). Without `names` the file is imported
    as any other (`load_file`); `names` ({name: value}) are globals set before its first line
    runs (the modules it uses, a function it calls, a worked solution's module's names), and it
    then runs in a namespace made of them, with `__name__` and `__file__` set."""
    path = Path(path)
    path.write_text(source, encoding="utf-8")
    if names is None:
        return load_file(name, path)
    module = types.ModuleType(name)
    vars(module).update(names)
    vars(module).update(__name__=name, __file__=str(path))
    exec(compile(source, str(path), "exec"), vars(module))  # noqa: S102 -- the tests' own source
    return module


def learner_copy(obj):
    """A worked solution as a learner who typed it has it (tests/test_own_code.py)."""
    return load_file("own_code_tests", ROOT / "tests" / "test_own_code.py").learner_copy(obj)


@contextmanager
def switched_kernels(folder, tag: str, body, switches: tuple, variants: dict, params: str):
    """{label: kernel} for a @triton.jit `body` whose last constexpr parameters are `switches`
    (each plants one known mistake; STORE, when one of them, is on unless a variant turns it
    off): per variant of `variants` ({label: {switch: value}}), a kernel `def kernel(<params>)`
    in its own module under `folder` that calls body with its parameters and those switches,
    as a learner's kernel with the exercise's signature would be. The body is importable as
    module tests_<tag>_exercise_body while the block runs."""
    module = f"tests_{tag}_exercise_body"
    holder = types.ModuleType(module)
    holder._body = body
    sys.modules[module] = holder
    args = ", ".join(p.split(":")[0].strip() for p in params.split(","))
    try:
        made = {}
        for label, switched in variants.items():
            flags = dict.fromkeys(switches, False)
            if "STORE" in flags:
                flags["STORE"] = True
            flags.update(switched)
            call = ", ".join(f"{k}={v}" for k, v in flags.items())
            name = f"{tag}_variant_{label.replace('-', '_')}"
            made[label] = written_module(
                name, Path(folder) / f"{name}.py",
                "import triton\nimport triton.language as tl\n"
                f"from {module} import _body\n\n\n@triton.jit\n"
                f"def kernel({params}):\n    _body({args}, {call})\n").kernel
        yield made
    finally:
        del sys.modules[module]


def puzzles_built_on_the_cpu(monkeypatch, pz) -> None:
    """Every puzzle of `pz` (ropelib.course.puzzles) builds its cases and its timed case on the
    CPU whatever device it is asked for, so that timing with a stand-in GPU runs the kernels in
    the interpreter on the puzzles' small cases."""
    import torch

    for p in pz.PUZZLES.values():
        build = p.build
        monkeypatch.setattr(p, "build", lambda gen, device, build=build: build(gen, "cpu"))
        if p.big is not None:
            monkeypatch.setattr(p, "big", lambda device, build=build: build(
                torch.Generator().manual_seed(0), "cpu")[0])
