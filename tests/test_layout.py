"""The package's floors: the product (`import ropelib`) stands on its own; the course
(`ropelib.course`) and the benchmark engine (`ropelib.bench`) sit on top of it and are never
imported by it."""
import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ropelib"
OUTSIDE_PRODUCT = ("ropelib.course", "ropelib.bench")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_outside_product(name: str) -> bool:
    return any(name == top or name.startswith(top + ".") for top in OUTSIDE_PRODUCT)


def _imported_modules(path: Path):
    """(line, absolute module name) of every import statement in `path`, relative ones resolved;
    `from package import name` also yields package.name (name may be a submodule)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            yield node.lineno, target
            for alias in node.names:
                yield node.lineno, f"{target}.{alias.name}"


def _product_files():
    for path in sorted(PACKAGE.rglob("*.py")):
        if not _is_outside_product(_module_name(path)):
            yield path


def test_product_modules_import_neither_course_nor_bench():
    files = list(_product_files())
    assert PACKAGE / "__init__.py" in files and PACKAGE / "api.py" in files
    bad = [f"{path.relative_to(ROOT)}:{line}: {name}"
           for path in files for line, name in _imported_modules(path)
           if _is_outside_product(name)]
    assert not bad, "product modules import the course or the benchmark engine:\n" + \
        "\n".join(bad)


def test_relative_imports_resolve_as_expected():
    """The checker's own resolution: a relative import in a subpackage names the right module."""
    path = PACKAGE / "kernels" / "launch.py"
    names = {name for _, name in _imported_modules(path)}
    assert "ropelib.runtime" in names and "ropelib.kernels.direct" in names


def test_import_ropelib_loads_neither_course_nor_bench():
    code = ("import sys, ropelib; "
            "print('\\n'.join(m for m in sys.modules if m.startswith('ropelib.')))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env=env, check=True).stdout.split()
    assert "ropelib.api" in out
    assert not [m for m in out if _is_outside_product(m)], out


def test_course_and_bench_are_packages():
    for name in OUTSIDE_PRODUCT + ("ropelib.course.exercises", "ropelib.course.kernels"):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations, name
        assert Path(spec.origin).resolve().is_relative_to(PACKAGE.resolve()), spec.origin
