# Stage H (session 2, fresh machine, TE parts stashed): TE, GPU tests (the int-pointer launch,
# graphs), host cost with TE, and the Q+K BLOCK_H rule A/B (winner left in /tmp for stage I).
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
step te_install 240 bash .te-bundle/install.sh install
step pytest_gpu 150 python -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/test_notebooks_sync.py --ignore=tests/test_packaging.py --durations=5
step probe_14 150 python benchmarks/probe.py --parts 14 --choice-file /tmp/ropelib_qk_choice
cat /tmp/ropelib_qk_choice
save stage_h
