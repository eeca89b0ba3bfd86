# Stage A: install Transformer Engine (parts stashed by earlier calls), tune, launch overhead.
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
step notebook_deps 120 python3 -m pip install --no-index --find-links .whl nbmake ipykernel ipywidgets tqdm
step te_install 360 bash .te-bundle/install.sh install
step overhead 120 python benchmarks/overhead.py
step tune 300 python benchmarks/tune.py --quick
save stage_a
