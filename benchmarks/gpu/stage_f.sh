# Stage F (session 2): deps + TE, GPU tests, notebooks 06 and 07 (issue 4's GPU run).
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
step notebook_deps 60 python3 -m pip install --no-index --find-links .whl nbmake ipykernel ipywidgets tqdm
step te_install 240 bash .te-bundle/install.sh install
step pytest_gpu 150 python -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/test_notebooks_sync.py --ignore=tests/test_packaging.py --durations=10
step notebooks_0607 120 python -m pytest -q -p no:cacheprovider --nbmake --nbmake-kernel=python3 --nbmake-timeout=300 notebooks/06-te-vs-triton-live.ipynb notebooks/07-debugging-allclose.ipynb --durations=5
save stage_f
