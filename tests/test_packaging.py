"""Packaging: pyproject.toml, environment.yml, the README's commands, and a clean `import ropelib`.

- environment.yml parses and lists what the project needs; its pip part dry-runs (slow, network);
- pyproject.toml declares the package, its dependencies (no exact torch pin) and extras;
- ropelib is installed (importable from outside the repository);
- `import ropelib` and every submodule imports without a GPU, with or without the interpreter,
  and without touching CUDA or Triton's GPU driver;
- the README shows the exact test command .ci/run runs, and its API tour runs.
"""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")


def _load_script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def check_env():
    return _load_script("check_env_yml")


@pytest.fixture(scope="module")
def pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------------------------
# environment.yml

def test_environment_yml_lists_what_the_notebooks_need(check_env):
    env = check_env.load_env(ROOT / "environment.yml")
    assert check_env.missing_requirements(env) == []
    conda, pip_lines = check_env.split_dependencies(env)
    assert "conda-forge" in env["channels"]
    # every conda package is either dry-run through pip or explicitly explained as not
    assert set(conda) <= check_env.PIP_RESOLVABLE | set(check_env.NOT_DRY_RUN)


def test_environment_yml_checker_catches_a_missing_package(check_env, tmp_path):
    text = (ROOT / "environment.yml").read_text(encoding="utf-8")
    broken = tmp_path / "environment.yml"
    broken.write_text(re.sub(r"(?m)^\s*- transformer-engine-torch.*\n", "", text))
    missing = check_env.missing_requirements(check_env.load_env(broken))
    assert missing == ["Transformer Engine (PyTorch)"]
    broken.write_text(text.replace("- -e .[test,hf]", "- ropelib"))
    assert check_env.missing_requirements(check_env.load_env(broken)) == [
        "ropelib installed editable (`-e .` in the pip section)"
    ]


@pytest.mark.slow
def test_environment_yml_pip_part_dry_runs(check_env):
    env = check_env.load_env(ROOT / "environment.yml")
    conda, pip_lines = check_env.split_dependencies(env)
    reqs = pip_lines + [check_env.conda_to_pip(n, conda[n]) for n in sorted(check_env.PIP_RESOLVABLE & set(conda))]
    result = check_env.pip_dry_run(reqs, cwd=ROOT)
    output = result.stdout + result.stderr
    if result.returncode != 0 and re.search(
        r"NewConnectionError|Temporary failure in name resolution|Network is unreachable|Could not fetch URL", output
    ):
        pytest.skip("no network to the package index: cannot dry-run environment.yml's pip part")
    assert result.returncode == 0, f"pip install --dry-run {' '.join(reqs)} failed:\n{output[-3000:]}"


# ---------------------------------------------------------------------------------------------
# pyproject.toml

def _names(requirements):
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_pyproject_declares_the_package(pyproject):
    project = pyproject["project"]
    assert project["name"] == "ropelib"
    assert project["requires-python"] == ">=3.10"
    assert _names(project["dependencies"]) == {"torch", "triton", "numpy"}
    torch_req = next(r for r in project["dependencies"] if r.startswith("torch"))
    assert "==" not in torch_req, "no exact torch pin in pyproject: users keep their CUDA torch"


def test_pyproject_extras(pyproject):
    extras = {k: _names(v) for k, v in pyproject["project"]["optional-dependencies"].items()}
    assert {"jupyterlab", "ipywidgets", "matplotlib", "jupytext"} <= extras["lab"]
    assert {"pytest", "pytest-xdist", "nbmake", "jupytext", "matplotlib", "ipywidgets", "playwright", "pyyaml"} <= extras["test"]
    assert "transformers" in extras["hf"]


def test_pytest_markers_are_registered(pytestconfig):
    registered = {line.split(":")[0].strip() for line in pytestconfig.getini("markers")}
    assert {"gpu", "browser", "slow"} <= registered


def test_ropelib_is_installed_from_this_checkout(tmp_path):
    # from a folder outside the repository, so only an installed ropelib can be found
    code = "import importlib.metadata as m, ropelib; print(ropelib.__file__); print(m.version('ropelib'), ropelib.__version__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, f"ropelib is not installed (pip install -e .):\n{out.stderr}"
    path, versions = out.stdout.splitlines()
    assert Path(path).resolve().parent == (ROOT / "ropelib").resolve(), f"ropelib imported from {path}, not this checkout"
    installed, runtime = versions.split()
    assert installed == runtime, f"installed metadata says {installed}, ropelib.__version__ is {runtime}: reinstall"


# ---------------------------------------------------------------------------------------------
# import ropelib without a GPU, touching nothing on the GPU

_IMPORT_PROBE = r"""
import importlib, json, pkgutil, sys, traceback
import torch, triton, triton.runtime
DriverConfig = type(triton.runtime.driver)  # the module attribute is the DriverConfig instance

touched = []
current = ["ropelib"]

def _record(what, real):
    def probe(*args, **kwargs):
        touched.append(f"{what} (while importing {current[-1]})")
        return real(*args, **kwargs)
    return probe

def _record_property(prop):
    real = getattr(DriverConfig, prop)
    def fget(self):
        touched.append(f"triton.runtime.driver.{prop} (while importing {current[-1]})")
        return real.fget(self)
    return property(fget)

for name in ("is_available", "device_count", "current_device", "get_device_name", "get_device_properties",
             "get_device_capability", "init", "_lazy_init", "synchronize", "set_device", "mem_get_info"):
    if hasattr(torch.cuda, name):
        setattr(torch.cuda, name, _record(f"torch.cuda.{name}()", getattr(torch.cuda, name)))
for prop in ("active", "default"):
    setattr(DriverConfig, prop, _record_property(prop))

failed, optional_missing = {}, {}
import ropelib
names = ["ropelib"] + [m.name for m in pkgutil.walk_packages(ropelib.__path__, "ropelib.")]
for name in names:
    current.append(name)
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in OPTIONAL:
            optional_missing[name] = e.name
        else:
            failed[name] = traceback.format_exc(limit=3)
    except Exception:
        failed[name] = traceback.format_exc(limit=3)
    current.pop()
print(json.dumps({"modules": names, "touched": touched, "failed": failed,
                  "optional_missing": optional_missing, "cuda_initialized": torch.cuda.is_initialized(),
                  "interpret": ropelib.INTERPRET}))
"""
# optional extras a submodule may need (the `hf` extra, Transformer Engine): missing is fine
_OPTIONAL = {"transformers", "transformer_engine"}


@pytest.mark.parametrize("interpret", [True, False], ids=["TRITON_INTERPRET=1", "no-interpreter"])
def test_import_ropelib_without_gpu_touches_no_cuda(interpret, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU, even on a GPU machine
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    code = f"OPTIONAL = {sorted(_OPTIONAL)!r}\n" + _IMPORT_PROBE
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"the import probe crashed:\n{out.stderr[-3000:]}"
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["interpret"] is interpret
    assert not report["failed"], "modules fail to import without a GPU:\n" + "\n".join(
        f"{name}:\n{tb}" for name, tb in report["failed"].items()
    )
    assert report["touched"] == [], f"import touched the GPU (nothing may, see docs/API.md): {report['touched']}"
    assert report["cuda_initialized"] is False
    assert "ropelib.runtime" in report["modules"] and "ropelib.reference" in report["modules"]


# ---------------------------------------------------------------------------------------------
# README

def _readme():
    return (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_shows_the_test_command_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    match = re.search(r"^TEST_CMD='([^']+)'", ci, re.M)
    assert match, ".ci/run defines TEST_CMD='...'"
    command = match.group(1)
    fenced = re.findall(r"```bash\n(.*?)```", _readme(), re.S)
    assert any(block.strip() == command for block in fenced), f"README.md has no ```bash block with exactly `{command}`"


def test_readme_has_one_setup_command_that_opens_the_notebooks():
    fenced = [b.strip() for b in re.findall(r"```bash\n(.*?)```", _readme(), re.S)]
    # JupyterLab serves the checkout (the notebooks' ../figures/ links resolve) and opens notebook 00
    # and the clone's git reads notebooks through the output-stripping filter (.gitconfig)
    # and JupyterLab saves the study notebooks without outputs (.jupyter/jupyter_server_config.py)
    lab = ("git config include.path ../.gitconfig && JUPYTER_CONFIG_PATH=$PWD/.jupyter "
           "jupyter lab --ServerApp.root_dir=. notebooks/00-setup-and-tour.ipynb")
    assert f"conda env create -f environment.yml && conda activate ropelib && {lab}" in fenced
    assert any(b.startswith("python3 -m venv .venv") and b.endswith(lab) for b in fenced)


def test_readme_sections():
    headings = re.findall(r"^## (.+)$", _readme(), re.M)
    for needed in ("API tour", "Notebooks", "Performance"):
        assert needed in headings, f"README.md lacks the section '## {needed}'"


@pytest.mark.slow
def test_readme_api_tour_runs(tmp_path):
    """The README's API tour is real code: run its preamble and tour blocks as one script."""
    text = _readme()
    preamble = re.search(r"## CPU mode.*?```python\n(.*?)```", text, re.S).group(1)
    tour = re.search(r"## API tour.*?```python\n(.*?)```", text, re.S).group(1)
    script = tmp_path / "tour.py"
    script.write_text(preamble + "\n" + tour + "\nprint('tour ok')\n")
    env = dict(os.environ)
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "tour ok" in out.stdout, f"README API tour failed:\n{out.stderr[-4000:]}"


def test_ci_script_is_strict_bash_and_pins_torch_before_ropelib():
    ci_path = ROOT / ".ci" / "run"
    syntax = subprocess.run(["bash", "-n", str(ci_path)], capture_output=True, text=True)
    assert syntax.returncode == 0, f".ci/run is not valid bash:\n{syntax.stderr}"
    ci = ci_path.read_text(encoding="utf-8")
    assert "set -euo pipefail" in ci
    torch_at = ci.index("pip_install torch==2.13.0")
    ropelib_at = ci.index('pip_install -e ".[test,lab,hf]"')
    assert torch_at < ropelib_at, "the CPU torch must be installed before ropelib, or pip pulls a CUDA torch"
    assert "export TRITON_INTERPRET=1" in ci


def test_notebook_figures_go_to_a_scratch_folder_unless_asked(monkeypatch, tmp_path):
    """Running a notebook must not rewrite committed figures: they go to a scratch folder, and
    to the checkout's figures/ only with ROPELIB_WRITE_FIGURES=1."""
    import tempfile
    from ropelib import runtime
    monkeypatch.delenv("ROPELIB_WRITE_FIGURES", raising=False)
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    scratch = runtime.figures_dir()
    assert scratch == tmp_path / "ropelib-figures" and scratch.is_dir()
    monkeypatch.setenv("ROPELIB_WRITE_FIGURES", "1")
    assert runtime.figures_dir() == Path(runtime.__file__).resolve().parents[1] / "figures"
    for nb in sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("0*.py")):
        text = nb.read_text()
        if "savefig" in text or "FIGURES /" in text:
            assert "figures_dir()" in text, f"{nb.name} writes figures outside figures_dir()"
