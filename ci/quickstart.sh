#!/usr/bin/env bash
# The main job (README): on a fresh machine, set everything up and build, probe, sign and look up
# one combination that the default package index can serve.
#   bash ci/quickstart.sh [selectors...]      (default: --cuda cu124 --vllm 0.8.4 --verl 0.4.1)
# Needs root (apt, dockerd). Leaves: the image in the local Docker engine and in the registry on
# 127.0.0.1:5000, records in ./results, the signed table in ./table, keys in ./keys.
set -euo pipefail
cd "$(dirname "$0")/.."
sel=("$@")
[ "${#sel[@]}" -gt 0 ] || sel=(--cuda cu124 --vllm 0.8.4 --verl 0.4.1)

bash ci/services.sh
PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 python3 -m pip install -q -e .
command -v nm >/dev/null || { apt-get update -qq; apt-get install -y -qq binutils >/dev/null; }

envbuild plan "${sel[@]}"
envbuild build "${sel[@]}" --base bootstrap --registry 127.0.0.1:5000 --push --probe cpu --results results
[ -f keys/envbuild.key ] || envbuild keygen --out keys
envbuild publish --results results --key keys/envbuild.key --out table
envbuild verify table --pubkey table/pubkey.json
envbuild pick "${sel[@]}" --table table --level contract
