#!/bin/bash
# Device side (issue 30): the probe's gpu level (hf engine, the node's own Python with its bytecode
# kept under a pycache prefix), before and after a change, side by side in one call: each variant
# with the page cache dropped (three rounds, interleaved), then once more warm.
#   before  the probe of an earlier revision, copied beside this tree (ignored by git, carried):
#             rm -rf bench/before_probe && mkdir -p bench/before_probe/envbuild_probe &&
#             git archive REV builder/probe | tar -x --strip-components=2 -C bench/before_probe/envbuild_probe
#           then run(carry=["bench/before_probe"], command="bash bench/probe_ab_h200.sh [ARGS]")
#   after   this tree's probe, with ARGS added to its command line
# Prints one line per run and writes $OUT/ab.json (every run's timings and checks); results in
# bench/probe_ab_h200.json.
set -u
out=/tmp/ab; mkdir -p "$out" /tmp/eb "${OUT:=/tmp/ab-out}"
ln -sfn "$PWD/builder" /tmp/eb/envbuild
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
one() {  # variant round drop
  local v=$1 tag=$2 drop=$3 mod=envbuild.probe path=/tmp/eb args=("${@:4}")
  [ "$v" = before ] && { mod=envbuild_probe; path=$PWD/bench/before_probe; args=(); }
  [ "$drop" = 1 ] && { sync; echo 3 > /proc/sys/vm/drop_caches; }
  PYTHONPATH=$path python3 -m $mod --level gpu --engine hf --json "$out/$v-$tag.json" "${args[@]}" > "$out/$v-$tag.log" 2>&1
  python3 bench/probe_runs.py line "$out/$v-$tag.json" "$v-$tag"
}
one after prime 0 "$@" >/dev/null; one before prime 0 >/dev/null  # bytecode for both, kept
for n in 1 2 3; do one before cold$n 1; one after cold$n 1 "$@"; done
one before warm 0; one after warm 0 "$@"
python3 bench/probe_runs.py collect "$out" "$OUT/ab.json"
