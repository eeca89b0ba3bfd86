#!/usr/bin/env bash
# Wheels the GPU machine has no index for, into ./.gpu-wheels (git ignores wheels): Liger
# Kernel (pure Python and Triton, no dependencies beyond torch and triton) for the floor
# suite's Liger column, and nbclient, ipykernel and ipywidgets with their dependencies (about
# 20 MB) for executing the notebooks (`gpu_run.sh notebooks`), and flash-attn's Triton rotary
# (below). Run where pip reaches PyPI, then carry .gpu-wheels to the GPU machine;
# benchmarks/gpu_run.sh installs what it finds there.
#   bash benchmarks/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu-wheels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu-wheels "liger-kernel==${LIGER_VERSION:-0.8.5}"
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform any -d .gpu-wheels nbclient ipykernel ipywidgets \
    einops
# flash-attn's rotary (the floor suite's flash_attn column) is two pure-Triton modules, but the
# package ships as a source archive whose build needs CUDA, and its __init__ imports the CUDA
# extension. Given a checkout of Dao-AILab/flash-attention (FLASH_ATTN_SRC), the two modules
# are copied unchanged, with its licence, under a package whose __init__ only names the version;
# gpu_run.sh puts .gpu-wheels/flash_attn_rotary on the path.
if [ -n "${FLASH_ATTN_SRC:-}" ]; then
    dst=.gpu-wheels/flash_attn_rotary/flash_attn
    rm -rf .gpu-wheels/flash_attn_rotary
    mkdir -p "$dst/layers" "$dst/ops/triton"
    version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$FLASH_ATTN_SRC/flash_attn/__init__.py")
    printf '"""flash-attn %s: only its Triton rotary (layers/rotary.py, ops/triton/rotary.py)."""\n__version__ = "%s"\n' \
        "$version" "$version" > "$dst/__init__.py"
    touch "$dst/layers/__init__.py" "$dst/ops/__init__.py" "$dst/ops/triton/__init__.py"
    cp "$FLASH_ATTN_SRC/flash_attn/layers/rotary.py" "$dst/layers/"
    cp "$FLASH_ATTN_SRC/flash_attn/ops/triton/rotary.py" "$dst/ops/triton/"
    cp "$FLASH_ATTN_SRC/LICENSE" "$dst/"
fi
ls -la .gpu-wheels
