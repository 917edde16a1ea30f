#!/usr/bin/env bash
# The main job (README): on a fresh machine, set everything up and build, probe, sign and look up
# one combination that the default package index can serve.
#   bash ci/quickstart.sh [selectors...]      (default: --cuda cu124 --vllm 0.8.4 --verl 0.4.1)
# Needs root (apt, dockerd). Installs envbuild into a virtual environment of its own, ./.venv
# (the distribution's python3 refuses `pip install` outside one: PEP 668). Leaves: the image in the
# local Docker engine and in the registry on 127.0.0.1:5000, records in ./results, the signed table
# in ./table, the signing key pair in ./keys. From cold on 2 cores: ~6 min quiet, ~8 at load 4, ~13 at load 6,
# ~20 GB of disk (README, Quickstart; bench/quickstart.py).
set -euo pipefail
cd "$(dirname "$0")/.."
sel=("$@")
[ "${#sel[@]}" -gt 0 ] || sel=(--cuda cu124 --vllm 0.8.4 --verl 0.4.1)
t0=$SECONDS
hb=""
trap '[ -z "$hb" ] || kill "$hb" 2>/dev/null || true' EXIT

elapsed() { local s=$((SECONDS - t0)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }
step() { printf '\n== quickstart [%s] %s\n' "$(elapsed)" "$*"; }
# Long steps that print little (debootstrap, a multi-GB push): a line every 30 s says it is alive.
with_heartbeat() {
  local what="$1" rc=0
  shift
  (while sleep 30; do echo "   ... $what: still running ($(elapsed) since start)"; done) &
  hb=$!
  "$@" || rc=$?
  kill "$hb" 2>/dev/null || true
  wait "$hb" 2>/dev/null || true
  hb=""
  return "$rc"
}

step "1/8 services: Docker engine and a registry on 127.0.0.1:5000 (ci/services.sh)"
bash ci/services.sh

step "2/8 envbuild into ./.venv"
bash ci/venv.sh
export PATH="$PWD/.venv/bin:$PATH"
command -v nm >/dev/null || { apt-get update -qq; apt-get install -y -qq binutils >/dev/null; }
envbuild --version

step "3/8 plan"
envbuild plan "${sel[@]}"

# One step: the build bootstraps the base (debootstrap from the distribution's packages, ~2 min
# cold) while the locks resolve, and pushes while it probes (envbuild.build, "What overlaps").
step "4/8 base image, lock, build, push and probe (~6 min cold: torch, the engine and verl are GBs)"
with_heartbeat "base/lock/build/push/probe" \
  envbuild build "${sel[@]}" --base bootstrap --repository 127.0.0.1:5000 --push --probe cpu --results results

step "5/8 signing key (./keys) and the signed table (./table)"
[ -f keys/envbuild.key ] || envbuild keygen --out keys
envbuild publish --results results --key keys/envbuild.key --out table

step "6/8 verify the table against the key generated in step 5"
envbuild verify table --pubkey keys/envbuild.pub.json

step "7/8 pick: the verified image, digest-pinned"
envbuild pick "${sel[@]}" --table table --pubkey keys/envbuild.pub.json --level contract

step "8/8 attach the signed test result, SBOM and provenance to the image, then verify the image itself"
envbuild attach --results results --key keys/envbuild.key
ref="$(envbuild pick "${sel[@]}" --table table --pubkey keys/envbuild.pub.json --level contract 2>/dev/null)"
envbuild verify "$ref" --pubkey keys/envbuild.pub.json

step "done in $(elapsed)"
cat <<'EOF'
The envbuild command lives in ./.venv: run `. .venv/bin/activate` (then `envbuild ...`), or call
.venv/bin/envbuild directly. Records: ./results; signed table: ./table (compat.json, compat.md,
index.html); keys: ./keys (keep envbuild.key private; give envbuild.pub.json to whoever picks).
EOF
