#!/usr/bin/env bash
# ropelib's GPU measurements from a clone of the repo, one step per call (each fits in a few
# minutes on an H100 or H200):
#
#   bash benchmarks/gpu_run.sh tests     # every GPU test: pytest -m gpu tests
#   bash benchmarks/gpu_run.sh targets   # python -m ropelib.bench --suite targets  (~5 min)
#   bash benchmarks/gpu_run.sh floor     # the README's table: --suite floor -> floor-<gpu>.csv (~5 min)
#                                        # (FLOOR_PARTS=REGEX: those parts only, into the CSV)
#   bash benchmarks/gpu_run.sh two-pass  # where the two-pass route pays (benchmarks/two_pass.py)
#   bash benchmarks/gpu_run.sh decode    # decode suite (host cost, CUDA graphs), host profile,
#                                        # launch cost per kernel argument, and a ropelib
#                                        # launch's host cost inside compiled code
#   bash benchmarks/gpu_run.sh model     # compiled GPT, 200 steps, rope=reference vs ropelib,
#                                        # default mode and reduce-overhead
#                                        # (python -m ropelib.course.model_step)
#   bash benchmarks/gpu_run.sh sweeps    # notebook 07's sweeps, fp32 and bf16 (~6 min)
#   bash benchmarks/gpu_run.sh fwdbwd    # what eager forward+backward rows time, and the multi-axis
#                                        # rows with and without rounds (~3 min)
#   bash benchmarks/gpu_run.sh ablation  # notebook 04's ablation: what makes the grid kernel fast
#   bash benchmarks/gpu_run.sh ladder    # notebook 05's ladder: from batch-reuse to the finished kernel
#   bash benchmarks/gpu_run.sh features  # fused QK-norm, KV-cache write, M-RoPE, table-free angles
#   bash benchmarks/gpu_run.sh qkv-backward  # the QKV backward's kernels at chosen tiles, then
#                                            # the fused projection against its providers
#   bash benchmarks/gpu_run.sh qkv-dy        # the QKV forward+backward in shuffled rounds, the dY
#                                        # backward against the unfused pipeline (~4 min)
#   bash benchmarks/gpu_run.sh qkv-mainloop  # the QKV projection's GEMM mainloop three ways vs cuBLAS
#   bash benchmarks/gpu_run.sh qkv-forward-ab  # qkv_rope_linear's forward: TMA main loop (two row
#                                              # tiles and four) vs pointer loads, 7 rounds in a
#                                              # new order each (~1 min; ORDER=fixed: the same)
#   bash benchmarks/gpu_run.sh qkv-table-flag  # its forward from a table against angles: the
#                                              # pre-pass's flag, kernel times, do_bench pairs
#   bash benchmarks/gpu_run.sh qkv-forward-ncu  # the fused forward and the probe's under Nsight
#                                               # Compute's sections (~1 min)
#   bash benchmarks/gpu_run.sh tables    # transformers' materialised cos/sin tables: what the
#                                        # flat pass reads (Nsight Compute) and the HF drop-in's
#                                        # time against the finished kernel and Liger (~2 min)
#   bash benchmarks/gpu_run.sh decode-ncu  # decode's kernels under Nsight Compute: where ropelib's
#                                          # warps wait, beside torch.compile's (~1 min)
#   bash benchmarks/gpu_run.sh puzzle9-ncu # notebook 13's puzzle 9 beside a copy's bytes, the
#                                          # same metrics (~1 min)
#   bash benchmarks/gpu_run.sh mrope_angles-ncu  # notebook 10's multi-axis kernels under Nsight
#                                                # Compute, warp states and cycles (~1 min)
#   bash benchmarks/gpu_run.sh ladder_stalls-ncu  # notebook 05's ladder rungs under Nsight Compute:
#                                        # warp states, occupancy, L1/L2 traffic (~1 min)
#   bash benchmarks/gpu_run.sh qk_norm-ncu  # QK-norm + RoPE forward+backward's kernels at two
#                                        # shapes of the same bytes under Nsight Compute (~1 min)
#   bash benchmarks/gpu_run.sh b1_gap-ncu  # batch 1: the flat pass beside torch.compile's kernel
#                                          # and an element-wise copy under Nsight Compute
#   bash benchmarks/gpu_run.sh contiguous-ncu  # notebook 06's .contiguous() of a stride-0
#                                        # gradient beside a fill and a copy (~1 min)
#   bash benchmarks/gpu_run.sh l2_writeback-ncu  # writing kernels between read-only sweeps, L2
#                                        # left as it is between kernels: the bytes a kernel's
#                                        # DRAM count misses, written back later (~1 min)
#   bash benchmarks/gpu_run.sh rows-ncu    # notebook 03's exercise 5 at 1-8 rows a program, beside
#                                        # notebook 04's kernel, under Nsight Compute (~1 min)
#   bash benchmarks/gpu_run.sh naive_warps-ncu  # notebook 03's naive kernel at 1, 2, 4, 8 warps
#                                               # under Nsight Compute, beside a row move (~1 min)
#   bash benchmarks/gpu_run.sh te-ncu    # Transformer Engine's fused kernel (installed first)
#                                        # beside the batch-reusing grid: instruction mix and
#                                        # warp states, for notebook 04 (~1 min); the *-ncu
#                                        # steps with NCU_CLOCK=none leave the SM clock free
#   bash benchmarks/gpu_run.sh mechanisms  # memory latency (pointer chase) and the pair swap's
#                                          # memory counters, for notebooks 05 and 03 (~2 min)
#   bash benchmarks/gpu_run.sh fwdbwd-mid  # the 64/256 MiB forward+backward taken apart; the
#                                          # two-pass route's early launch on and off (~3 min)
#   bash benchmarks/gpu_run.sh host-rounds  # what do_bench times at batch 1 (its loop written
#                                        # out, autograd's device thread on and off, beside TE),
#                                        # and the compiled GPT's step in alternating rounds,
#                                        # both torch.compile modes (~3 min)
#   bash benchmarks/gpu_run.sh probes    # the flat pass at 1 GiB (one_gib_probe), decode tiles
#                                        # under CUDA graphs (~3 min)
#   bash benchmarks/gpu_run.sh flat-tiles  # the flat pass's program size and warps beside
#                                        # torch.compile and a copy, sbhd forwards (~2 min)
#   bash benchmarks/gpu_run.sh course    # the course's measurements (ladder, generations, Nsight
#                                        # Compute profile) written where the notebooks read them,
#                                        # then the notebooks that read them executed (03, 04, 05):
#                                        # pages that show the data as it now is (~5 min)
#   bash benchmarks/gpu_run.sh notebooks # every notebook executed with its outputs (needs nbclient
#                                        # and ipykernel; installed from ./.gpu-wheels if there;
#                                        # ONLY=NN-slug for the ones named so, ONLY=03,07 for several;
#                                        # KEEP_GOING=1: every cell runs after one fails)
#
# Several steps in one call: bash benchmarks/gpu_run.sh tests decode.
# Providers the GPU machine lacks (Liger Kernel) come as wheels in ./.gpu-wheels, made on a
# machine with an index by `bash benchmarks/gpu_wheels.sh` and carried there; they are
# installed first, into /tmp/gpu-site (the machine's own packages are left as they are).
# CSVs and logs land in benchmarks/results/, named with the GPU and the UTC date; when $OUT is
# set (a lent machine that sends back what is under $OUT, a few files at most) they go there
# too, as one tarball a call (results-<gpu>-<date>-<pid>.tar.gz), written when the call ends,
# also when it is stopped (SIGTERM, as `timeout` sends).
# Transformer Engine is compared when `import transformer_engine.pytorch` works.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=benchmarks/results
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 \
      | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '-' | sed 's/-$//')
stamp=$(date -u +%Y%m%d-%H%M)
tag="${gpu:-gpu}-$stamp"
rc=0

if compgen -G ".gpu-wheels/liger_kernel-*.whl" >/dev/null && ! "$PY" -c "import liger_kernel" 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --target /tmp/gpu-site .gpu-wheels/liger_kernel-*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/gpu-site"
fi
# flash-attn's Triton rotary (benchmarks/gpu_wheels.sh says how it is made), and einops for it
if [ -d .gpu-wheels/flash_attn_rotary ] && ! "$PY" -c "import flash_attn.layers.rotary" 2>/dev/null; then
    if compgen -G ".gpu-wheels/einops-*.whl" >/dev/null && ! "$PY" -c "import einops" 2>/dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --target /tmp/gpu-site .gpu-wheels/einops-*.whl
    fi
    export PYTHONPATH="$PYTHONPATH:$PWD/.gpu-wheels/flash_attn_rotary:/tmp/gpu-site"
fi

KEPT=()
keep() {   # files to send back in this call's tarball under $OUT (pack, when the call ends)
    KEPT+=("$@")
    return 0
}

pack() {   # the kept files that exist, as one tarball under $OUT
    [ -n "${OUT:-}" ] || return 0
    local have=() f
    for f in ${KEPT[@]+"${KEPT[@]}"}; do [ -f "$f" ] && have+=("$f"); done
    [ ${#have[@]} -gt 0 ] && tar czf "$OUT/results-$tag-$$.tar.gz" "${have[@]}"
    return 0
}
trap pack EXIT
trap 'exit 143' TERM

find_ncu() {   # Nsight Compute's command line: on PATH, else where CUDA and its installer put it
    command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null \
        | tail -1
}

step() {
    local name=$1 log="$RESULTS/$1-$tag.log"
    shift
    echo "=== $name ($(date -u +%H:%M:%S))"
    keep "$log"            # (kept before it runs: a call stopped midway sends back what it has)
    "$@" 2>&1 | tee "$log"
    local status=${PIPESTATUS[0]}
    [ "$status" -eq 0 ] || { echo "=== $name failed: exit $status"; rc=1; }
}

for what in "${@:-tests}"; do
    case "$what" in
        tests)
            step pytest-gpu "$PY" -m pytest -q -m gpu tests -p no:cacheprovider
            # the two-pass route's tests (bit for bit with the finished kernel), compiled
            step pytest-two-pass "$PY" -m pytest -q tests/test_two_pass.py -p no:cacheprovider ;;
        floor)
            # FLOOR_PARTS=REGEX: only the parts it selects, written into the committed CSV in
            # place of their rows (the others and their dates kept)
            if [ -n "${FLOOR_PARTS:-}" ]; then
                step floor "$PY" -m ropelib.bench --suite floor --cases "$FLOOR_PARTS" \
                    --into "$RESULTS/floor-$gpu.csv"
            else
                step floor "$PY" -m ropelib.bench --suite floor --out "$RESULTS/"
            fi
            keep "$RESULTS"/floor-"$gpu".csv ;;
        two-pass)
            step two-pass "$PY" benchmarks/two_pass.py --compile --out "$RESULTS"
            keep "$RESULTS"/two_pass-"$gpu".csv ;;
        targets)
            step targets "$PY" -m ropelib.bench --suite targets --out "$RESULTS/targets-$tag.csv"
            keep "$RESULTS/targets-$tag.csv" ;;
        decode)
            step decode "$PY" -m ropelib.bench --suite decode --out "$RESULTS/decode-$tag.csv"
            keep "$RESULTS/decode-$tag.csv"
            step host "$PY" benchmarks/host_probe.py
            step launch-cost "$PY" benchmarks/launch_cost.py --out "$RESULTS/launch-cost-$tag.csv"
            keep "$RESULTS/launch-cost-$tag.csv"
            step compiled-launch "$PY" benchmarks/compiled_launch_cost.py \
                --out "$RESULTS/compiled-launch-cost-$tag.csv"
            keep "$RESULTS/compiled-launch-cost-$tag.csv" ;;
        model)
            step model "$PY" -m ropelib.course.model_step --out "$RESULTS/model-$tag.csv"
            keep "$RESULTS/model-$tag.csv"
            step model-reduce-overhead "$PY" -m ropelib.course.model_step --mode reduce-overhead \
                --out "$RESULTS/model-reduce-overhead-$tag.csv"
            keep "$RESULTS/model-reduce-overhead-$tag.csv" ;;
        sweeps)
            step sweeps "$PY" benchmarks/seed_sweeps.py
            keep "$RESULTS/seed_sweeps.csv" figures/07-seed-*.png ;;
        ablation)
            step ablation "$PY" benchmarks/ablation.py --out "$RESULTS/ablation-$gpu.csv"
            keep "$RESULTS/ablation-$gpu.csv" ;;
        ladder)
            step ladder "$PY" benchmarks/ladder.py --out "$RESULTS/ladder-$gpu.csv"
            keep "$RESULTS/ladder-$gpu.csv" ;;
        features)
            for bench in qk_norm decode_cache mrope; do
                step "$bench" "$PY" "benchmarks/${bench}_bench.py" --out "$RESULTS/$bench-$tag.csv"
                keep "$RESULTS/$bench-$tag.csv"
            done
            step angle_precision "$PY" benchmarks/angle_precision.py --time \
                --out "$RESULTS/angle_precision-$tag.csv" --figure figures/10-angle-precision.png
            keep "$RESULTS/angle_precision-$tag.csv" figures/10-angle-precision.png ;;
        qkv-backward)
            # the QKV projection's backward kernels at their tiles and at wider dW column blocks
            # (fewer programs re-evaluate each token's sin and cos), then the providers end to
            # end (benchmarks/qkv_rope_bench.py)
            step qkv-backward "$PY" benchmarks/qkv_tiles.py --out "$RESULTS" \
                --tile dx=64,64,8,4,3 --tile dw=32,128,8,4,4 --tile dw=32,256,8,8,3 \
                --tile dw=32,256,8,8,2 --tile dw=64,256,8,8,2
            keep "$RESULTS"/qkv_tiles_chosen-"$gpu"-*.csv
            step qkv-rope "$PY" benchmarks/qkv_rope_bench.py --out "$RESULTS/qkv_rope-$gpu.csv"
            keep "$RESULTS/qkv_rope-$gpu.csv" ;;
        qkv-dy)
            # forward+backward in seven shuffled rounds: the dY backward (q's and k's gradients
            # rotated straight into dY's columns) against the prologues and the unfused
            # pipeline, without and with QK-norm (~4 min)
            step qkv-dy "$PY" benchmarks/qkv_dy_probe.py --rounds 7 \
                --out "$RESULTS/qkv_dy_rounds-$tag.csv"
            step qkv-dy-qk-norm "$PY" benchmarks/qkv_dy_probe.py --qk-norm --rounds 7 \
                --out "$RESULTS/qkv_dy_rounds_qk_norm-$tag.csv"
            keep "$RESULTS/qkv_dy_rounds-$tag.csv" "$RESULTS/qkv_dy_rounds_qk_norm-$tag.csv" ;;
        qkv-forward-ncu)
            # ropelib's fused forward against the mainloop probe's rotating TMA kernel (and both
            # bare GEMMs, cuBLAS) under Nsight Compute's sections: notebook 12's open question
            step qkv-forward-ncu "$PY" benchmarks/qkv_forward_ncu_probe.py --out "$RESULTS"
            keep "$RESULTS/qkv_forward_ncu-$gpu.csv" ;;
        qkv-mainloop)
            step qkv-mainloop "$PY" benchmarks/qkv_mainloop_probe.py \
                --out "$RESULTS/qkv_mainloop-$gpu.csv"
            keep "$RESULTS/qkv_mainloop-$gpu.csv" ;;
        qkv-forward-ab)
            step qkv-forward-ab "$PY" benchmarks/qkv_forward_ab.py ${ORDER:+--order "$ORDER"} \
                --out "$RESULTS/qkv_forward_ab-$tag.csv"
            keep "$RESULTS/qkv_forward_ab-$tag.csv" ;;
        qkv-table-flag)
            step qkv-table-flag "$PY" benchmarks/qkv_table_flag_probe.py ;;
        tables)
            # transformers' materialised tables: Qwen2-VL's per-axis ones and Hugging Face's
            # [B, S, D] ones (transformers' views, contiguous bhsd) under Nsight Compute
            # (benchmarks/tables_read_probe.py, hf_tables_ncu_probe.py; bytes read and time per
            # kernel, Liger's beside), then HF's timed against the finished kernel and Liger's rope
            ncu=$(find_ncu)
            if [ -n "$ncu" ]; then
                for probe in tables_read hf_tables_ncu; do
                    name=${probe%_ncu}_ncu      # (the CSV: tables_read_ncu, hf_tables_ncu)
                    "$ncu" --profile-from-start off --csv --metrics gpu__time_duration.sum,\
dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
lts__t_sector_hit_rate.pct,l1tex__t_sector_hit_rate.pct,launch__grid_size \
                        "$PY" "benchmarks/${probe}_probe.py" 2>/dev/null | grep -v '^==PROF==' \
                        > "$RESULTS/$name-$tag.csv"
                    keep "$RESULTS/$name-$tag.csv"
                done
            else
                echo "=== tables: no ncu on this machine: the Nsight Compute part is skipped"
            fi
            step hf-tables "$PY" benchmarks/hf_tables_probe.py ;;
        decode-ncu|puzzle9-ncu|te-ncu|mrope_angles-ncu|naive_warps-ncu|rows-ncu|ladder_stalls-ncu|qk_norm-ncu|b1_gap-ncu|contiguous-ncu|l2_writeback-ncu)
            # a probe's launches under Nsight Compute with the warp-state metrics
            # (compare.WARP_STATE_METRICS): decode-ncu, ropelib's decode kernel (angles, and a
            # cos/sin table) beside torch.compile's kernel of Hugging Face's formula
            # (benchmarks/decode_ncu.py); puzzle9-ncu, notebook 13's puzzle 9 beside a copy's
            # bytes (benchmarks/puzzle9_ncu.py); te-ncu, Transformer Engine's fused kernel beside
            # the batch-reusing grid and TE's grid in Triton, with the instruction mix too
            # (benchmarks/te_ncu.py; TE installed first); mrope_angles-ncu, notebook 10's two
            # multi-axis kernels and ropelib's (benchmarks/mrope_angles_ncu.py); naive_warps-ncu,
            # notebook 03's naive kernel at 1, 2, 4 and 8 warps (benchmarks/naive_warps_ncu.py);
            # rows-ncu, notebook 03's exercise 5 at 1, 2, 4 and 8 rows a program beside notebook
            # 04's kernel (benchmarks/rows_ncu.py);
            # ladder_stalls-ncu, notebook 05's ladder rungs at b = 8 and b = 1
            # (benchmarks/ladder_stalls_ncu.py); qk_norm-ncu, QK-norm + RoPE forward+backward at
            # b8 s4096 and b2 s16384 (benchmarks/qk_norm_ncu.py); b1_gap-ncu, the flat pass at batch
            # 1 beside torch.compile's kernel and an element-wise copy (benchmarks/b1_gap_ncu.py);
            # contiguous-ncu, notebook 06's .contiguous() of a stride-0 gradient beside a fill and
            # a copy of the same elements (benchmarks/contiguous_ncu.py); l2_writeback-ncu, writing
            # kernels between read-only sweeps with L2 neither flushed nor invalidated by the
            # profiler (--cache-control none): where the bytes a kernel's count misses go
            # (benchmarks/l2_writeback_ncu.py, for notebooks 04 and 10)
            probe=${what%-ncu}_ncu
            cache=()
            [ "$probe" = l2_writeback_ncu ] && cache=(--cache-control none)
            # NCU_CLOCK=none: the clock left free (Nsight Compute locks it to base unless told);
            # the file's name says so
            clock_tag=${NCU_CLOCK:+-clock-$NCU_CLOCK}
            ncu=$(find_ncu)
            if [ -n "$ncu" ]; then
                # `# key: value` lines first (compare.read_meta), then ncu's table
                "$PY" -c "from ropelib.bench import compare
m = compare.environment_meta()
for k in ('date', 'gpu', 'torch', 'triton', 'transformer_engine', 'revision', 'ropelib_source'):
    if m.get(k): print(f'# {k}: {m[k]}')
print('# what: Nsight Compute (--profile-from-start off --csv${NCU_CLOCK:+ --clock-control $NCU_CLOCK}${cache[*]:+ ${cache[*]}}) of benchmarks/$probe.py')" \
                    > "$RESULTS/$probe-$tag$clock_tag.csv"
                "$ncu" --profile-from-start off --csv ${NCU_CLOCK:+--clock-control "$NCU_CLOCK"} \
                    ${cache[@]+"${cache[@]}"} \
                    --metrics "$("$PY" "benchmarks/$probe.py" \
                    --metrics --ncu "$ncu")" "$PY" "benchmarks/$probe.py" 2>/dev/null \
                    | grep -v '^==PROF==' \
                    >> "$RESULTS/$probe-$tag$clock_tag.csv"
                keep "$RESULTS/$probe-$tag$clock_tag.csv"
            else
                echo "=== $what: no ncu on this machine"; rc=1
            fi ;;
        mechanisms)
            # notebook 05's memory latency (a pointer chase, idle and beside a copy) and notebook
            # 03's pair swap under Nsight Compute (sectors per request, L1 hits, L2 and DRAM
            # traffic of stride-2 loads and stores), written where the notebooks read them
            step memory-latency "$PY" benchmarks/memory_latency.py --out "$RESULTS"
            step access-counters "$PY" benchmarks/access_counters.py --out "$RESULTS"
            keep "$RESULTS/memory_latency-$gpu.csv" "$RESULTS/access_counters-$gpu.csv" ;;
        fwdbwd)
            # eager forward+backward: GPU time, host time and do_bench both ways
            # (benchmarks/fwdbwd_probe.py), then the floor's multi-axis rows with and without
            # rounds, ropelib first and last
            step fwdbwd-probe "$PY" benchmarks/fwdbwd_probe.py
            step fwdbwd-multi-axis-rounds "$PY" benchmarks/fwdbwd_probe.py --multi-axis-rounds ;;
        fwdbwd-mid)
            # the 64 and 256 MiB forward+backward taken apart (replayed device time, host enqueue
            # time, the kernels of a call) beside torch.compile and TE, then the two-pass route's
            # early launch and pre-pass width (benchmarks/mid_fwdbwd_probe.py, ~3 min)
            step mid-fwdbwd "$PY" benchmarks/mid_fwdbwd_probe.py
            step mid-fwdbwd-variants "$PY" benchmarks/mid_fwdbwd_probe.py --variants ;;
        host-rounds)
            step dobench-gap "$PY" benchmarks/dobench_gap_probe.py
            step model-rounds-reduce-overhead "$PY" benchmarks/model_step_rounds.py \
                --mode reduce-overhead
            step model-rounds-default "$PY" benchmarks/model_step_rounds.py --mode default ;;
        probes)
            step one-gib "$PY" benchmarks/one_gib_probe.py --out "$RESULTS"
            step decode-tiles "$PY" benchmarks/decode_tiles.py --out "$RESULTS"
            keep "$RESULTS"/one_gib_probe-"$gpu".csv "$RESULTS"/decode_tiles-"$gpu".csv ;;
        flat-tiles)
            step flat-tiles "$PY" benchmarks/flat_tiles_probe.py --out "$RESULTS"
            keep "$RESULTS"/flat_tiles_probe-*.csv ;;
        course)
            # in the tree (committed paths) first, so that the pages rendered next read them
            step ladder "$PY" benchmarks/ladder.py --out "$RESULTS/ladder-$gpu.csv" \
                --figure figures/05-ladder-waterfall.png
            step generations "$PY" benchmarks/generations.py --out "$RESULTS/generations-$gpu.csv" \
                --figure figures/04-generations-gbps.png
            step mechanism "$PY" benchmarks/mechanism.py --ncu --out "$RESULTS"
            # (one tarball: a lent machine sends back a few files only)
            [ -n "${OUT:-}" ] && tar czf "$OUT/course-$tag.tar.gz" "$RESULTS/ladder-$gpu.csv" \
                "$RESULTS/generations-$gpu.csv" "$RESULTS"/mechanism-"$gpu"* \
                figures/05-ladder-waterfall.png figures/04-generations-gbps.png
            ONLY=${ONLY:-03,04,05} bash "$0" notebooks || rc=1 ;;
        notebooks)
            if ! "$PY" -c "import nbclient, ipykernel" 2>/dev/null && [ -d .gpu-wheels ]; then
                "$PY" -m pip install -q --no-index --find-links .gpu-wheels nbclient ipykernel ipywidgets
            fi
            # (a lent machine sends back at most 8 files: the executed notebooks come as one
            # tarball; ONLY=09-rope runs the notebooks whose name contains it)
            executed=benchmarks/scratch/executed
            step notebooks "$PY" benchmarks/run_notebooks.py --out "$executed" \
                ${ONLY:+--only "$ONLY"} ${KEEP_GOING:+--keep-going}
            [ -n "${OUT:-}" ] && tar czf "$OUT/executed-$tag.tar.gz" -C "$executed" . ;;
        *)
            echo "unknown step: $what (tests, targets, floor, two-pass, decode, decode-ncu, puzzle9-ncu, te-ncu, mrope_angles-ncu, naive_warps-ncu, rows-ncu, ladder_stalls-ncu, qk_norm-ncu, b1_gap-ncu, contiguous-ncu, model, sweeps, ablation, ladder, features, qkv-backward, qkv-dy, qkv-mainloop, qkv-forward-ab, qkv-table-flag, tables, fwdbwd, fwdbwd-mid, probes, flat-tiles, course, notebooks)"; exit 2 ;;
    esac
done
exit $rc
