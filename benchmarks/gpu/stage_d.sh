# Stage D: GPU tests and every notebook on the GPU (timings per notebook from --durations).
source benchmarks/gpu/common.sh
python -c "import transformers" 2>/dev/null && echo "transformers present" || echo "transformers missing"
step pytest_gpu 240 python -m pytest -q -x -p no:cacheprovider -m "gpu" tests --durations=15
export ROPELIB_NB08_STEPS=${ROPELIB_NB08_STEPS:-1500}
step notebooks 330 python -m pytest -q -p no:cacheprovider --nbmake --nbmake-kernel=python3 --nbmake-timeout=600 notebooks --durations=20
save stage_d
