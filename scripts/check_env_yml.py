"""Check environment.yml without conda: parse it, check it lists what the project needs, and
dry-run the part of it that pip can resolve on this machine.

    python scripts/check_env_yml.py            # parse + required packages + pip dry-run
    python scripts/check_env_yml.py --no-pip   # parse + required packages only (offline)

What is dry-run here (`pip install --dry-run`, nothing is installed):
- the `pip:` section as written (`-e .[test,hf]`: ropelib's own metadata and its extras), run from
  the repository root as conda runs it;
- the pure-Python / wheel-only conda packages under their (identical) PyPI names: jupyterlab,
  ipykernel, ipywidgets, matplotlib, jupytext, tqdm, pyyaml, numpy, triton.

What cannot be dry-run here, and why:
- conda itself cannot be installed on these machines, so the conda solve (channel conda-forge)
  is not run: `python=3.11`, `pytorch-gpu` and `transformer-engine-torch` are checked by name and
  version spec only;
- `pytorch-gpu` has no pip counterpart that may be resolved here: pip's torch for Linux is a
  multi-GB CUDA build, and this machine keeps its CPU torch 2.13.0 (the dry-run pins torch to
  the installed version so the resolver never reaches for another);
- `transformer-engine-torch` is a conda-forge binary; pip's `transformer_engine[pytorch]` builds
  a CUDA extension from source (nvcc, cuDNN), which a CPU machine cannot do.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ENV_FILE = ROOT / "environment.yml"

# What the environment must provide: a label -> the conda package names that satisfy it.
REQUIRED_CONDA = {
    "python 3.11": ("python",),
    "GPU PyTorch": ("pytorch-gpu",),
    "Triton": ("triton",),
    "Transformer Engine (PyTorch)": ("transformer-engine-torch",),
    "JupyterLab": ("jupyterlab",),
    "ipywidgets": ("ipywidgets",),
    "matplotlib": ("matplotlib",),
    "jupytext": ("jupytext",),
    "pip": ("pip",),
}
# conda packages whose conda-forge name is also their PyPI name and that pip can resolve here.
PIP_RESOLVABLE = {"jupyterlab", "ipykernel", "ipywidgets", "matplotlib", "jupytext", "tqdm", "pyyaml", "numpy", "triton"}
# conda packages checked by name only (see the module docstring for why).
NOT_DRY_RUN = {
    "python": "the interpreter itself (conda's)",
    "pip": "the installer itself",
    "pytorch-gpu": "conda-forge's CUDA PyTorch; pip's would be a multi-GB CUDA torch",
    "transformer-engine-torch": "conda-forge binary; pip's builds a CUDA extension from source",
}

_SPEC = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*?)\s*$")


def load_env(path: Path = ENV_FILE) -> dict:
    """Parse environment.yml and check its shape; raises ValueError naming what is wrong."""
    env = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(env, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(env).__name__}")
    for key in ("name", "channels", "dependencies"):
        if key not in env:
            raise ValueError(f"{path}: missing top-level key {key!r}")
    if not isinstance(env["dependencies"], list):
        raise ValueError(f"{path}: 'dependencies' must be a list")
    return env


def split_dependencies(env: dict) -> tuple[dict[str, str], list[str]]:
    """-> ({conda name: version spec}, [pip requirement lines])."""
    conda: dict[str, str] = {}
    pip_lines: list[str] = []
    for dep in env["dependencies"]:
        if isinstance(dep, str):
            m = _SPEC.match(dep)
            if not m:
                raise ValueError(f"environment.yml: cannot read the conda dependency {dep!r}")
            conda[m.group(1).lower()] = m.group(2)
        elif isinstance(dep, dict) and set(dep) == {"pip"}:
            if not isinstance(dep["pip"], list) or not all(isinstance(x, str) for x in dep["pip"]):
                raise ValueError("environment.yml: the 'pip:' section must be a list of strings")
            pip_lines.extend(dep["pip"])
        else:
            raise ValueError(f"environment.yml: unexpected dependency entry {dep!r}")
    return conda, pip_lines


def missing_requirements(env: dict) -> list[str]:
    """Labels of required packages that environment.yml does not list (empty when all are there)."""
    conda, pip_lines = split_dependencies(env)
    missing = [label for label, names in REQUIRED_CONDA.items() if not any(n in conda for n in names)]
    if not conda.get("python", "").lstrip("=").startswith("3.11"):
        missing.append(f"python pinned to 3.11 (found {conda.get('python')!r})")
    if env.get("name") != "ropelib":
        missing.append(f"environment name 'ropelib' (found {env.get('name')!r})")
    if not any(re.match(r"^-e\s+\.(\[.*\])?$", line.strip()) for line in pip_lines):
        missing.append("ropelib installed editable (`-e .` in the pip section)")
    return missing


def conda_to_pip(name: str, spec: str) -> str:
    """A conda `name spec` as a pip requirement (`=3.11` means `==3.11.*` in conda)."""
    spec = spec.replace(" ", "")
    if re.fullmatch(r"=[0-9][0-9.]*", spec):
        spec = "=" + spec + ".*"
    return name + spec


def pip_dry_run(requirements: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`pip install --dry-run` of `requirements`, run from `cwd`, torch pinned to the installed one."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        reqs = Path(tmp) / "requirements.txt"
        reqs.write_text("\n".join(requirements) + "\n")
        pins = Path(tmp) / "constraints.txt"
        pins.write_text(f"torch=={torch.__version__}\n")
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "-r", str(reqs), "-c", str(pins)]
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env-file", type=Path, default=ENV_FILE)
    ap.add_argument("--no-pip", action="store_true", help="skip the pip dry-run (offline)")
    args = ap.parse_args(argv)

    env = load_env(args.env_file)
    conda, pip_lines = split_dependencies(env)
    print(f"{args.env_file.name}: env {env['name']!r}, channels {env['channels']}")
    print(f"  conda: {', '.join(f'{k}{v}' for k, v in conda.items())}")
    print(f"  pip:   {', '.join(pip_lines)}")
    missing = missing_requirements(env)
    if missing:
        print("MISSING: " + "; ".join(missing))
        return 1
    print("  all required packages are listed")
    for name, why in NOT_DRY_RUN.items():
        if name in conda:
            print(f"  not dry-run: {name}{conda[name]} ({why})")
    unknown = sorted(set(conda) - PIP_RESOLVABLE - set(NOT_DRY_RUN))
    if unknown:
        print(f"  not dry-run, unclassified (add to PIP_RESOLVABLE or NOT_DRY_RUN): {unknown}")
        return 1
    if args.no_pip:
        return 0

    pip_reqs = pip_lines + [conda_to_pip(n, conda[n]) for n in sorted(PIP_RESOLVABLE & set(conda))]
    print(f"  pip install --dry-run {' '.join(pip_reqs)}  (from {args.env_file.parent})")
    result = pip_dry_run(pip_reqs, cwd=args.env_file.parent)
    noise = re.compile(r"^WARNING: Location .* is ignored")
    out = "\n".join(l for l in (result.stdout + result.stderr).splitlines() if not noise.match(l)).strip()
    if out:
        print(out)
    if result.returncode != 0:
        print(f"pip dry-run FAILED (exit {result.returncode})")
        return 1
    print("  pip dry-run resolved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
