# Stage E (a fresh machine after fixes): deps + TE, launch overhead, the issue-5 suite, and the
# notebooks that failed on the GPU in stage D.
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
step notebook_deps 60 python3 -m pip install --no-index --find-links .whl nbmake ipykernel ipywidgets tqdm
step te_install 240 bash .te-bundle/install.sh install
step overhead 60 python benchmarks/overhead.py
step bench_targets 300 python -m ropelib.bench --suite targets
step notebooks 150 python -m pytest -q -p no:cacheprovider --nbmake --nbmake-kernel=python3 --nbmake-timeout=300 notebooks/00-setup-and-tour.ipynb notebooks/03-naive-triton-kernel.ipynb notebooks/04-batch-reuse-grid-kernel.ipynb notebooks/06-te-vs-triton-live.ipynb notebooks/07-debugging-allclose.ipynb --durations=10
save stage_e
