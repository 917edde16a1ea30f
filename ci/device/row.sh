#!/bin/bash
# Device side of judging a row in place on the lent GPU node (host side: bench/h200_rows.py).
# The node has torch and most of the stack but no Docker and no index; a call carries at most
# 64 MiB, and the machine keeps /tmp while it stays warm, so the row's wheelhouse travels in pieces
# over back-to-back calls.
#   bash ci/device/row.sh stash DIR              copy the pieces carried in DIR to /tmp/wh
#   bash ci/device/row.sh run DIR [SELECTORS…]   stash DIR, reassemble split files, then
#        envbuild venv (the row's lock, offline, the node's own distributions reused where they are
#        the lock's pins, the engine's JIT kernels compiled) and envbuild probe --here --level gpu,
#        recording the row in place
#   bash ci/device/row.sh venv DIR [SELECTORS…]   the same up to the venv (a call of its own where
#        venv and probe together could run past a call's limit)
#   bash ci/device/row.sh probe - [TAG]           the gpu probe again in that venv (outputs named TAG)
# Writes into $OUT (when set): record-<row>.json, verdict.json, venv.json, probe.log, gpumem.csv.
# ROW_VENV=DIR (default /tmp/row-venv) and ROW_VENV_ARGS (more `envbuild venv` flags: --no-kernels)
# make a second venv beside the first, for a side-by-side.
# ROW_COMPARE=1: then also an uncompiled venv's probe and the compiled one's again (verdict-*.json).
set -u
mode=${1:?stash|run|venv|probe}; dir=${2:?carried folder}; shift 2
wh=/tmp/wh; out=${OUT:-/tmp/row-out}; mkdir -p "$wh/files" "$wh/parts" "$out"
venv=${ROW_VENV:-/tmp/row-venv}
mkdir -p /tmp/eb && ln -sfn "$PWD/builder" /tmp/eb/envbuild
export PYTHONPATH=/tmp/eb PYTHONUNBUFFERED=1 ENVBUILD_CACHE=/tmp/eb-cache

probe() {  # probe TAG: the gpu level in the venv, recorded; GPU memory sampled beside it
  nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 200 > "$out/gpumem$1.csv" &
  local smi=$!
  python3 -m envbuild probe --here --python-exe "$venv/bin/python" --level gpu --results /tmp/results \
    --output "$out/verdict$1.json" 2>&1 | tee "$out/probe$1.log"
  local rc=${PIPESTATUS[0]}
  kill $smi 2>/dev/null
  for f in /tmp/results/records/*/*.json; do cp "$f" "$out/record-$(basename "$(dirname "$f")")$1.json"; done
  echo "probe$1 exit $rc; peak nvidia-smi memory.used MiB: $(cut -d, -f2 "$out/gpumem$1.csv" | sort -n | tail -1)"
  return "$rc"
}
if [ "$mode" = probe ]; then probe "${1:+-$1}"; exit $?; fi
cp -R "$dir"/locks "$wh"/ 2>/dev/null
cp "$dir"/manifest.json "$wh"/ 2>/dev/null
cp "$dir"/files/* "$wh/files"/ 2>/dev/null
cp "$dir"/parts/* "$wh/parts"/ 2>/dev/null
echo "stashed: $(find "$wh/files" -type f | wc -l) files, $(find "$wh/parts" -type f | wc -l) parts, $(du -sh "$wh" | cut -f1)"
[ "$mode" = stash ] && exit 0

# Split files: parts/<name>.partNN -> files/<name>; the manifest's sha256 checks every file below.
for first in "$wh"/parts/*.part00; do
  [ -e "$first" ] || break
  name=$(basename "$first" .part00)
  cat "$wh"/parts/"$name".part[0-9]* > "$wh/files/$name"  # the glob sorts: part00, part01, ...
done
# envbuild from this working tree (linked above): the package lives in builder/, imported as envbuild.
rm -rf "$venv" /tmp/results
t0=$(date +%s.%N)
# shellcheck disable=SC2086 # ROW_VENV_ARGS: flags, split on spaces
python3 -m envbuild venv "$@" --wheelhouse "$wh" --out "$venv" --host-packages --results /tmp/results --json ${ROW_VENV_ARGS:-} \
  > "$out/venv.json" 2> "$out/venv.err"
rc=$?
t1=$(date +%s.%N)
cat "$out/venv.err"
if [ $rc != 0 ]; then
  for f in /tmp/results/records/*/*.json; do [ -e "$f" ] && cp "$f" "$out/record-$(basename "$(dirname "$f")").json"; done
  echo "envbuild venv exit $rc"; exit "$rc"
fi
echo "venv $(python3 -c "print(round($t1 - $t0, 1))") s"
[ "$mode" = venv ] && exit 0
probe ""
rc=$?
if [ "${ROW_COMPARE:-}" = 1 ]; then
  # Side by side in this session (bench only, not recorded): the same row in a venv left
  # uncompiled (--no-compile), probed; then the compiled venv probed a second time (warm caches).
  python3 -m envbuild venv "$@" --wheelhouse "$wh" --out /tmp/row-venv-nc --host-packages --no-compile --json \
    > "$out/venv-nc.json" 2>/dev/null
  for what in nc:/tmp/row-venv-nc again:$venv; do
    python3 -m envbuild probe --here --python-exe "${what#*:}/bin/python" --level gpu \
      --output "$out/verdict-${what%%:*}.json" > "$out/probe-${what%%:*}.log" 2>&1
    echo "compare ${what%%:*}: exit $?"
  done
fi
exit "$rc"
