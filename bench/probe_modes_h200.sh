#!/bin/bash
# Device side (issue 30): a row's gpu level (a venv made by `envbuild venv`, as ci/device/row.sh
# leaves it) with the contract level beside the gpu level (--side-by-side yes) and after it (no):
# three rounds with the page cache dropped before each run, the order turning, then each once
# more warm (MODES="yes no" by default; also "auto"), on whichever card is lent (H200 or H100).
# hf's default (vocab.EngineSpec.side_by_side) rests on its runs on a row's venv (probe_modes_h100.json,
# probe_modes_h200.json); the node's own Python, without verl, had shown no gain (probe_ab_h200.sh).
# Run it in the call that ran `row.sh run` (the venv lives in that machine's /tmp):
#   run(carry=[".whl/pNN"], command="bash ci/device/row.sh run .whl/pNN SEL; bash bench/probe_modes_h200.sh")
# LEVEL=env (or contract) tries the script off a GPU node.
# VAR names the variable the modes set (default ENVBUILD_PROBE_SIDE_BY_SIDE): VAR=ENVBUILD_PROBE_PREFETCH
# MODES="1 0" compares the probe's read-ahead with none (probe/prefetch.py).
# VAR=ENVBUILD_PROBE_WARM_IMPORT MODES="after beside no": the tiny model's modules imported after CUDA, beside it, or not
# (probe/warmup.py).
# Prints one line per run and writes $OUT/modes.json (every run's status, checks and timings).
set -u
py=${1:-/tmp/row-venv/bin/python}; out=/tmp/modes; mkdir -p "$out" /tmp/eb "${OUT:=/tmp/modes-out}"
ln -sfn "$PWD/builder" /tmp/eb/envbuild
one() {  # mode tag drop
  local mode=$1 tag=$2 drop=$3 t0 rc
  [ "$drop" = 1 ] && { sync; echo 3 > /proc/sys/vm/drop_caches; }
  t0=$(date +%s.%N)
  PYTHONPATH=/tmp/eb env "${VAR:-ENVBUILD_PROBE_SIDE_BY_SIDE}=$mode" python3 -m envbuild probe --here --python-exe "$py" \
    --level "${LEVEL:-gpu}" --output "$out/$mode-$tag.json" > "$out/$mode-$tag.log" 2>&1
  rc=$?
  python3 bench/probe_runs.py line "$out/$mode-$tag.json" "$mode-$tag" "$rc" \
    "$(python3 -c "import time; print(round(time.time() - $t0, 2))")"
}
read -ra modes <<< "${MODES:-yes no}"
for n in 1 2 3; do  # the order turns each round
  k=$(( (n - 1) % ${#modes[@]} )); order=("${modes[@]:k}" "${modes[@]:0:k}")
  for m in "${order[@]}"; do one "$m" cold$n 1; done
done
for m in "${modes[@]}"; do one "$m" warm 0; done
python3 bench/probe_runs.py collect "$out" "$OUT/modes.json"
