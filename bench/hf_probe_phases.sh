#!/bin/bash
# Device side (issue 30): the hf probe's phases on the node's own Python, varied one thing at a time:
# the level (contract: no CUDA warm-up thread; gpu: with it), and bytecode (the node sets
# PYTHONDONTWRITEBYTECODE=1 and its torch has no __pycache__; a pycache prefix lets it be kept).
set -u
out=${OUT:-/tmp/hf-phases}; mkdir -p "$out" /tmp/eb
ln -sfn "$PWD/builder" /tmp/eb/envbuild
export PYTHONPATH=/tmp/eb PYTHONUNBUFFERED=1
one() {  # name, level, extra env...
  local name=$1 level=$2; shift 2
  env "$@" python3 -m envbuild.probe --level "$level" --engine hf --json "$out/$name.json" > "$out/$name.log" 2>&1
  python3 bench/probe_runs.py line "$out/$name.json" "$name"
}
one contract-1 contract; one gpu-1 gpu; one contract-2 contract; one gpu-2 gpu
rm -rf /tmp/pyc
one pyc-write gpu PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
one pyc-read gpu PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
one pyc-read-contract contract PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
du -sh /tmp/pyc
