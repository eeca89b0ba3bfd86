# Sourced by the stage scripts: environment and a helper that saves what a stage produced.
# Run from the repository root on the GPU machine (device tool); $OUT comes back.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg
unset TRITON_INTERPRET
mkdir -p "$OUT"
step() {   # step NAME TIMEOUT_S CMD... : run with a time limit, log to $OUT/NAME.log, never abort the stage
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$OUT/steps.txt"
  tail -n 25 "$OUT/$name.log"
}
save() {   # save STAGE: results and figures written by this stage, in one archive
  find benchmarks/results figures -newer "$OUT/.start" -type f 2>/dev/null > "$OUT/new-files.txt"
  tar czf "$OUT/$1-files.tgz" -T "$OUT/new-files.txt" 2>/dev/null
  cat "$OUT/new-files.txt"
}
touch "$OUT/.start"
