#!/bin/bash
# Device side of carrying vLLM to the lent H200 (plan and host side: bench/vllm_h200_carry.py).
# The H200 has torch/transformers but no vLLM and no network; a call carries at most 64 MiB, and
# the machine keeps /tmp while it stays warm, so the wheel travels in pieces over back-to-back calls.
#   bash ci/device/vllm_h200.sh stash DIR   copy the pieces carried in DIR to /tmp (one call each)
#   bash ci/device/vllm_h200.sh run DIR     stash DIR, reassemble, check sha256, install --target,
#                                           run the probe's gpu level with --engine vllm
# Writes into $OUT (when set): verdict.json, probe.log, carry.json, gpumem.csv.
set -u
mode=${1:?stash|run}; dir=${2:?carried folder}
parts=/tmp/vllm.whl.parts; wheels=/tmp/vllm.wheels; site=/tmp/site
out=${OUT:-/tmp/vllm-h200-out}; mkdir -p "$parts" "$wheels" "$out"
cp "$dir"/*.part[0-9]* "$parts"/ 2>/dev/null
cp "$dir"/*.whl "$wheels"/ 2>/dev/null
cp "$dir"/manifest.txt /tmp/vllm.manifest.txt 2>/dev/null
echo "pieces here: $(ls "$parts" | tr '\n' ' ')"
[ "$mode" = stash ] && exit 0

# manifest.txt: "<sha256>  <wheel name>  <piece count>"
read -r sha name count < /tmp/vllm.manifest.txt || { echo "no manifest carried"; exit 2; }
have=$(ls "$parts"/"$name".part[0-9]* 2>/dev/null | wc -l)
if [ "$have" != "$count" ]; then echo "have $have of $count pieces of $name: carry the missing ones"; exit 3; fi
t0=$(date +%s.%N)
if [ ! -f "$site/.installed-$sha" ]; then
  cat $(ls "$parts"/"$name".part[0-9]* | sort) > "$wheels/$name"
  echo "$sha  $wheels/$name" | sha256sum -c - || exit 4
  rm -rf "$site"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl || exit 5
  touch "$site/.installed-$sha"
fi
t1=$(date +%s.%N)
mkdir -p /tmp/pp && ln -sfn "$PWD/builder/probe" /tmp/pp/envbuild_probe
export PYTHONPATH=$site:/tmp/pp PYTHONUNBUFFERED=1
# flashinfer is not carried (vLLM lists it, but for Qwen2 on Hopper it is only a fast path): without
# this, vLLM 0.24 imports it for its top-p/top-k sampler at engine start (No module named 'flashinfer').
export VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}
python3 - <<PY > "$out/carry.json"
import json, os, subprocess
w = "$wheels"
print(json.dumps({"wheels": {f: os.path.getsize(os.path.join(w, f)) for f in sorted(os.listdir(w))},
                  "site_bytes": int(subprocess.run(["du", "-sb", "$site"], capture_output=True, text=True).stdout.split()[0]),
                  "install_seconds": round($t1 - $t0, 2), "sha256": "$sha"}, indent=1))
PY
nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 200 > "$out/gpumem.csv" &
smi=$!
mkdir -p /tmp/probe-scratch
python3 -m envbuild_probe --level gpu --engine vllm --expect-cuda 13.0 --json "$out/verdict.json" \
  --scratch /tmp/probe-scratch ${PROBE_ARGS:-} 2>&1 | tee "$out/probe.log"
rc=${PIPESTATUS[0]}
kill $smi 2>/dev/null
echo "probe exit $rc; peak nvidia-smi memory.used MiB: $(cut -d, -f2 "$out/gpumem.csv" | sort -n | tail -1)"
exit $rc
