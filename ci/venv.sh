#!/usr/bin/env bash
# envbuild in a virtual environment of its own, ./.venv: the distribution's python3 refuses
# `pip install` outside one (PEP 668). Shared by the README's two commands.
#   bash ci/venv.sh [EXTRAS]        `all` (default: every command), `test` (all + the test dependencies)
# Env: PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
extras="${1:-all}"
if [ ! -x .venv/bin/python ]; then
  if ! "$PY" -m venv .venv >/dev/null 2>&1; then
    rm -rf .venv  # Debian and Ubuntu ship venv (ensurepip) in a package of its own
    echo "venv.sh: installing python3-venv (apt)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    "$PY" -m venv .venv
  fi
fi
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
.venv/bin/python -m pip install -q -e ".[$extras]"
