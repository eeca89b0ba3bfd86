#!/usr/bin/env bash
# Wheels the GPU machine has no index for, into ./.gpu-wheels (git ignores wheels): Liger
# Kernel (pure Python and Triton, no dependencies beyond torch and triton) for the floor
# suite's Liger column, and nbclient, ipykernel and ipywidgets with their dependencies (about
# 20 MB) for executing the notebooks (`gpu_run.sh notebooks`). Run where pip reaches PyPI, then
# carry .gpu-wheels to the GPU machine; benchmarks/gpu_run.sh installs what it finds there.
#   bash benchmarks/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu-wheels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu-wheels "liger-kernel==${LIGER_VERSION:-0.8.5}"
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform any -d .gpu-wheels nbclient ipykernel ipywidgets
ls -la .gpu-wheels
