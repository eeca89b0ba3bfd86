"""Packaging: pyproject.toml, environment.yml, the README's commands, and a clean `import ropelib`.

- environment.yml parses and lists what the project needs; its pip part dry-runs (slow, network);
- pyproject.toml declares the package, its dependencies (no exact torch pin) and extras;
- ropelib is installed (importable from outside the repository);
- `import ropelib` and every submodule imports without a GPU, with or without the interpreter,
  and without touching CUDA or Triton's GPU driver;
- the README shows the exact test command .ci/run runs, one set-up command per way of
  installing (conda; pip with a GPU; pip with a CPU build of PyTorch, installed into the virtual
  environment before ropelib), and its API tour runs;
- the torch floor (pyproject.toml, environment.yml, README) covers every torch API ropelib calls.
"""
import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from loading import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")


def _load_script(name):
    module = load_file(name, ROOT / "scripts" / f"{name}.py")
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


def test_environment_yml_points_to_the_readme_for_its_command():
    """The command that creates the conda environment and opens the notebooks lives in one place,
    the README: environment.yml names that section and shows no `jupyter lab` command of its own
    (one that differs from the README's would send learners to pages whose figures 404)."""
    text = (ROOT / "environment.yml").read_text(encoding="utf-8")
    readme_commands = [b.strip() for b in re.findall(r"```bash\n(.*?)```", _readme(), re.S)]
    for line in text.splitlines():
        if "jupyter lab" in line:
            command = line.lstrip("# ").strip()
            assert command in readme_commands, (
                f"environment.yml shows a command the README does not: {command!r}; point to "
                "the README's section instead")
    match = re.search(r'README\.md, section "([^"]+)"', text)
    assert match, 'environment.yml: say where the command is (README.md, section "...")'
    assert f"## {match.group(1)}" in _readme().splitlines(), \
        f"README.md has no section '## {match.group(1)}'"


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


# JupyterLab serves the checkout (the notebooks' ../figures/ links resolve) and opens notebook 00
# and the clone's git reads notebooks through the output-stripping filter (.gitconfig)
# and JupyterLab saves the study notebooks without outputs (.jupyter/jupyter_server_config.py)
_LAB = ("git config include.path ../.gitconfig && JUPYTER_CONFIG_PATH=$PWD/.jupyter "
        "jupyter lab --ServerApp.root_dir=. notebooks/00-setup-and-tour.ipynb")
_CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def _setup_commands():
    """The README's fenced commands that set up an environment and open the notebooks."""
    fenced = [b.strip() for b in re.findall(r"```bash\n(.*?)```", _readme(), re.S)]
    return [b for b in fenced if b.endswith(_LAB)]


def test_readme_has_one_setup_command_that_opens_the_notebooks():
    setups = _setup_commands()
    assert f"conda env create -f environment.yml && conda activate ropelib && {_LAB}" in setups
    venv = "python3 -m venv .venv && . .venv/bin/activate && "
    gpu = [b for b in setups if b.startswith(venv) and _CPU_TORCH not in b]
    cpu = [b for b in setups if b.startswith(venv) and _CPU_TORCH in b]
    assert gpu == [f'{venv}pip install -e ".[lab]" && {_LAB}'], \
        "README.md: one pip set-up command for a machine with a GPU"
    assert cpu == [f'{venv}{_CPU_TORCH} && pip install -e ".[lab]" && {_LAB}'], \
        "README.md: one pip set-up command for a machine without a GPU (CPU torch, then ropelib)"
    assert len(setups) == 3, f"one set-up command per way of installing, got {len(setups)}"
    for block in setups:
        syntax = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True)
        assert syntax.returncode == 0, f"not valid bash: {block}\n{syntax.stderr}"


def test_readme_installs_the_cpu_torch_inside_the_venv_before_ropelib():
    """Run in another order (CPU torch before the venv exists, as prose outside the command once
    said), the CPU torch lands outside the venv and `pip install -e` pulls a CUDA torch in."""
    text = _readme()
    fenced = re.findall(r"```bash\n(.*?)```", text, re.S)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    assert "pip install torch" not in prose, \
        "README.md: install torch only inside the set-up command, after the venv is active"
    for block in fenced:
        steps = [s.strip() for s in block.strip().split("&&")]
        if not any(s.startswith("pip install torch") for s in steps):
            continue
        torch_at = next(i for i, s in enumerate(steps) if s.startswith("pip install torch"))
        assert ". .venv/bin/activate" in steps[:torch_at], f"torch installed outside the venv: {block}"
        assert any(s.startswith("pip install -e") for s in steps[torch_at + 1:]), \
            f"the CPU torch must come before ropelib (pip install -e): {block}"


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


# ---------------------------------------------------------------------------------------------
# The torch floor: every torch API ropelib calls, with the PyTorch release that introduced it.
# Installing PyTorch 2.6 itself to run the tests is not practical here (PyPI's Linux torch is
# a CUDA build of ~770 MB plus its CUDA libraries), so the floor is checked against this table:
# a new torch API in ropelib fails the test until it is listed here with its release, and a
# release above the floor fails it until pyproject.toml, environment.yml and the README say so.
# (2, 0) stands for "2.0 or earlier": every such API is well below any floor ropelib could have.

_OLD = (2, 0)
TORCH_API_SINCE = {
    # 2.0 or earlier
    **{f"torch.{name}": _OLD for name in (
        "Generator", "Size", "SymInt", "Tensor", "__version__", "__file__", "version.cuda",
        "device", "dtype",
        "finfo", "promote_types", "contiguous_format", "manual_seed", "is_grad_enabled",
        "no_grad", "autocast", "compile", "load", "random.fork_rng",
        # (deterministic algorithms: 1.8, warn_only 1.11; they fill fresh memory since 2.1)
        "use_deterministic_algorithms", "are_deterministic_algorithms_enabled",
        "is_deterministic_algorithms_warn_only_enabled",
        "bool", "uint8", "int8", "int16", "int32", "int64", "long", "float16", "bfloat16",
        "float32", "float64", "complex64", "complex128",
        "allclose", "arange", "argmax", "argsort", "as_tensor", "atan2", "bincount", "block_diag",
        "cat", "floor", "logspace", "searchsorted",
        "chunk", "clamp", "cos", "empty", "empty_like", "empty_strided", "equal", "eye", "frexp",
        "full", "full_like", "isclose", "isfinite", "isnan", "ldexp", "meshgrid", "multinomial",
        "nextafter", "ones", "ones_like", "outer", "polar", "rand", "randint", "randn",
        "randn_like", "randperm", "remainder", "repeat_interleave", "sin", "sort", "split",
        "stack", "tensor", "topk", "unique", "view_as_complex", "view_as_real", "where", "zeros",
        "zeros_like",
        "autograd.Function", "autograd.backward", "autograd.grad",
        "autograd.functional.jacobian", "autograd.DeviceType.CPU", "autograd.DeviceType.CUDA",
        "cuda.CUDAGraph", "cuda.Event", "cuda.Stream", "cuda.cudart", "cuda.current_device",
        "cuda.current_stream",
        "cuda.get_device_capability", "cuda.get_device_name", "cuda.get_device_properties",
        "cuda.graph",
        "cuda.is_available", "cuda.is_current_stream_capturing", "cuda.max_memory_allocated",
        "cuda.mem_get_info", "cuda.reset_peak_memory_stats", "cuda.stream", "cuda.synchronize",
        "distributed.all_gather_into_tensor", "distributed.all_reduce", "distributed.broadcast",
        "distributed.get_global_rank", "distributed.get_rank", "distributed.get_world_size",
        "distributed.is_available", "distributed.is_initialized",
        "distributed.reduce_scatter_tensor",
        "nn.Dropout", "nn.Embedding", "nn.LayerNorm", "nn.Linear", "nn.Module", "nn.ModuleList",
        "nn.Parameter", "nn.functional.cross_entropy", "nn.functional.gelu",
        "nn.functional.scaled_dot_product_attention", "nn.functional.softmax",
        "nn.init.normal_", "nn.init.zeros_", "nn.utils.clip_grad_norm_",
        "optim.AdamW", "optim.Optimizer",
        "profiler.ProfilerActivity.CPU", "profiler.ProfilerActivity.CUDA", "profiler.profile",
        "profiler.record_function",
        # (the autograd profiler, and whether one runs: 1.x)
        "autograd.profiler.profile", "_C._autograd._profiler_enabled",
        # internals, each read defensively (getattr with a default) or stable since 2.0
        "_C", "_C._functorch", "_C._get_tracing_state", "_C._len_torch_dispatch_stack",
        "_dynamo.explain", "_dynamo.reset", "_subclasses.FakeTensor",
        # the course's exercise checks: an ATen operator barred in an answer (block_diag: 1.8),
        # watched through a dispatch mode (1.13)
        "ops.aten.block_diag.default", "utils._python_dispatch.TorchDispatchMode",
        "utils._pytree.tree_leaves",
        # a timer barred in an answer (torch.utils.benchmark: public since 1.8)
        "utils.benchmark.Timer",
        # every block_diag overload, its decomposition, and the watch kept on: the Python
        # dispatch key (1.11) and the mode stack's C++ functions (2.0)
        "ops.aten.block_diag", "_decomp.decomposition_table", "_C.DispatchKey.Python",
        # (PyTorch's dispatch of an operator to the mode told from an answer's switch: 1.12)
        "_C.DispatchKey.PythonTLSSnapshot",
        "_C._dispatch_tls_is_dispatch_key_excluded", "_C._dispatch_tls_set_dispatch_key_excluded",
        "_C._get_dispatch_stack_at", "_C._push_on_torch_dispatch_stack",
        # (least squares refused in a fit written by hand: linalg.lstsq 1.9, pinv's atol/rtol 1.11)
        "ops.aten.linalg_lstsq.default", "ops.aten.linalg_pinv.atol_rtol_tensor",
    )},
    "torch.float8_e4m3fn": (2, 1),
    "torch.autograd.graph.increment_version": (2, 1),
    "torch.autograd.set_multithreading_enabled": (2, 0),
    "torch.testing.assert_close": (1, 9),
    "torch.unravel_index": (2, 2),
    "torch.nn.attention.bias.causal_lower_right": (2, 2),
    "torch.compiler.is_compiling": (2, 3),
    "torch.library.custom_op": (2, 4),
    # the device-type forms (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))
    "torch.is_autocast_enabled": (2, 4),
    "torch.get_autocast_dtype": (2, 4),
    "torch.library.CustomOpDef.register_fake": (2, 4),       # op.register_fake(...)
    "torch.library.CustomOpDef.register_autograd": (2, 4),   # op.register_autograd(...)
    "torch.library.triton_op": (2, 6),
    "torch.library.wrap_triton": (2, 6),
}
# methods of the op objects torch.library.custom_op / triton_op return (torch.library.CustomOpDef)
_OP_METHODS = ("register_fake", "register_autograd", "register_kernel", "register_vmap",
               "register_torch_dispatch", "register_autocast", "set_kernel_enabled")


def torch_apis_used(source: str) -> set:
    """Every `torch.<dotted name>` a module's source uses (through `import torch`, `import
    torch.x as y`, `from torch.x import y`), plus the CustomOpDef methods it calls; ropelib's own
    operators (torch.ops.ropelib.*) are not torch APIs."""
    tree = ast.parse(source)
    alias = {}
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch" or a.name.startswith("torch."):
                    if a.asname:
                        alias[a.asname] = a.name
                    else:
                        alias["torch"] = "torch"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and (node.module == "torch" or node.module.startswith("torch.")):
            for a in node.names:
                alias[a.asname or a.name] = f"{node.module}.{a.name}"
                used.add(f"{node.module}.{a.name}")
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:   # a whole a.b.c chain
            parts, n = [], node
            while isinstance(n, ast.Attribute):
                parts.append(n.attr)
                n = n.value
            if isinstance(n, ast.Name) and n.id in alias:
                used.add(".".join([alias[n.id], *reversed(parts)]))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in _OP_METHODS:
            used.add(f"torch.library.CustomOpDef.{node.func.attr}")
    used = {u for u in used if not u.startswith("torch.ops.ropelib")}
    # a name that only leads to a longer one (torch.nn in torch.nn.Module) is not an API of its own
    return {u for u in used if u in TORCH_API_SINCE or not any(v.startswith(u + ".") for v in used)}


def _ropelib_torch_apis() -> dict:
    """{torch API: [files of ropelib that use it]} over the whole package."""
    found = {}
    for path in sorted((ROOT / "ropelib").rglob("*.py")):
        for name in torch_apis_used(path.read_text(encoding="utf-8")):
            found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def _floor(spec: str, name: str) -> tuple:
    match = re.search(r">=\s*(\d+)\.(\d+)", spec)
    assert match, f"{name}: no '>=' floor in {spec!r}"
    return int(match.group(1)), int(match.group(2))


def _torch_floor(pyproject) -> tuple:
    spec = next(r for r in pyproject["project"]["dependencies"] if _names([r]) == {"torch"})
    return _floor(spec, "pyproject.toml's torch")


def test_torch_floor_covers_every_torch_api_ropelib_calls(pyproject):
    floor = _torch_floor(pyproject)
    found = _ropelib_torch_apis()
    assert "torch.library.triton_op" in found and "torch.library.CustomOpDef.register_autograd" in found
    unknown = {name: files for name, files in found.items() if name not in TORCH_API_SINCE}
    assert not unknown, (
        "ropelib calls torch APIs this test does not know: add each to TORCH_API_SINCE with the "
        "PyTorch release that introduced it:\n" + "\n".join(f"  {n}  ({', '.join(f)})"
                                                          for n, f in sorted(unknown.items())))
    newer = {name: TORCH_API_SINCE[name] for name in found if TORCH_API_SINCE[name] > floor}
    assert not newer, (f"these torch APIs are newer than the floor torch>={floor[0]}.{floor[1]} "
                       f"in pyproject.toml: {newer}; raise the floor (pyproject.toml, "
                       "environment.yml, README) or avoid them")


def test_torch_api_scan_catches_a_newer_api():
    source = ("import torch\nimport torch.nn as nn\nfrom torch.library import triton_op\n"
              "x = torch.library.register_torch_dispatch\ny = nn.Linear\nop.register_vmap(f)\n"
              "z = torch.ops.ropelib.rope\n")
    assert torch_apis_used(source) == {
        "torch.library.register_torch_dispatch", "torch.nn.Linear", "torch.library.triton_op",
        "torch.library.CustomOpDef.register_vmap"}


def test_torch_apis_ropelib_calls_exist_in_the_installed_torch():
    import importlib
    import torch
    missing = []
    for name in sorted(_ropelib_torch_apis()):
        obj, parts = torch, name.split(".")[1:]
        for i, part in enumerate(parts):
            if not hasattr(obj, part) and isinstance(obj, type(torch)):
                try:   # a submodule not imported yet (torch.nn.attention.bias)
                    importlib.import_module(".".join(["torch", *parts[:i + 1]]))
                except ImportError:
                    pass
            if not hasattr(obj, part):
                missing.append(name)
                break
            obj = getattr(obj, part)
    assert not missing, f"torch {torch.__version__} lacks: {missing}"


def test_the_torch_floor_is_stated_alike_everywhere(pyproject, check_env):
    floor = _torch_floor(pyproject)
    conda, _ = check_env.split_dependencies(check_env.load_env(ROOT / "environment.yml"))
    assert _floor(conda["pytorch-gpu"], "environment.yml's pytorch-gpu") == floor
    assert f"PyTorch {floor[0]}.{floor[1]} or newer" in _readme(), \
        f"README.md: say 'PyTorch {floor[0]}.{floor[1]} or newer'"
    # the Triton that torch's floor release is built with (torch 2.6 pins triton 3.2.0)
    triton_for_torch = {(2, 6): (3, 2), (2, 7): (3, 3), (2, 8): (3, 4), (2, 9): (3, 5)}
    triton_spec = next(r for r in pyproject["project"]["dependencies"] if _names([r]) == {"triton"})
    assert _floor(triton_spec, "pyproject.toml's triton") == triton_for_torch[floor]
    assert _floor(conda["triton"], "environment.yml's triton") == triton_for_torch[floor]
