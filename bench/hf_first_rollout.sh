#!/bin/bash
# Device side: where the hf engine's first rollout spends its time on a fresh GPU node (issue 30).
# Runs the probe's gpu level with the node's own Python (torch + transformers, no verl) under
# cProfile, twice (first and warm), and once with CUDA modules loaded eagerly.
set -u
out=${OUT:-/tmp/hf-prof}; mkdir -p "$out" /tmp/eb
ln -sfn "$PWD/builder" /tmp/eb/envbuild
export PYTHONPATH=/tmp/eb PYTHONUNBUFFERED=1
for run in first warm; do
  python3 -c "import cProfile, sys; from envbuild.probe.cli import main
cProfile.run('main([\"--level\", \"gpu\", \"--engine\", \"hf\", \"--json\", \"$out/$run.json\"])', '$out/$run.prof')" \
    > "$out/$run.log" 2>&1; echo "$run exit $?"
done
CUDA_MODULE_LOADING=EAGER python3 -m envbuild.probe --level gpu --engine hf --json "$out/eager.json" > "$out/eager.log" 2>&1
echo "eager exit $?"
for run in first warm eager; do
  python3 -c "import json,sys; t=json.load(open('$out/$run.json'))['timings']; print('$run', {k: t[k] for k in ('process','env','contract','gpu','engine_start','rollout','rollout2','update') if k in t})"
done
python3 - "$out" <<'PY'
import pstats, sys
p = pstats.Stats(f"{sys.argv[1]}/first.prof")
p.sort_stats("cumulative").print_stats(25)
PY
