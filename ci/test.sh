#!/usr/bin/env bash
# The test command (README): sets up everything on a fresh machine, then runs the whole suite.
#   bash ci/test.sh [pytest args...]      ENVBUILD_TEST_WORKERS=N: pytest workers (default 2)
# 1. Debian packages the tests use (chromium for the page test, binutils for the probe's
#    symbol check), 2. the Docker engine and a loopback registry (ci/services.sh), qemu
#    emulation of the other platform (ci/emulation.sh: the linux/arm64 base test) and room on
#    the disk for the suite's images (ci/docker_room.sh),
# 3. envbuild with its test extras, plus CPU torch/transformers for the probe's GPU-level
#    logic on CPU, and the host's bootstrap base, 4. pytest on two workers (pytest-xdist).
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
# Phase stamps: where a fresh machine's time goes (seconds since start, 1-minute load average).
stamp() { echo "test.sh: [$(( $(date +%s) - t0 )) s, load $(cut -d' ' -f1 /proc/loadavg)] $*"; }

need=()
command -v chromium >/dev/null || need+=(chromium)
command -v nm >/dev/null || need+=(binutils)
command -v shellcheck >/dev/null || need+=(shellcheck)  # actionlint checks run: scripts with it
command -v zstd >/dev/null || need+=(zstd)  # --compression zstd compresses with it (test_push_compression)
if [ "${#need[@]}" -gt 0 ]; then
  echo "test.sh: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

stamp "packages ready"
bash ci/services.sh
bash ci/emulation.sh
# A machine that keeps Docker's state between runs keeps BuildKit's cache too: bounded here, so
# runs do not fill the disk one uncached rebuild at a time.
bash ci/docker_room.sh
stamp "docker engine, registry and emulation ready"

# envbuild and its test dependencies in ./.venv (PEP 668: never the distribution's python3).
bash ci/venv.sh test
export PATH="$PWD/.venv/bin:$PATH" PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
PY=.venv/bin/python
# The host's bootstrap base, once, before the test workers start (beside the torch install
# below): the tests that build on it reuse it, and none of them removes a base it did not make.
base_log=$(mktemp)
"$PY" -m envbuild base bootstrap > "$base_log" 2>&1 &
base_pid=$!
# CPU torch for the probe's gpu-level logic on CPU: this workplace keeps a CPU build of 2.13.0 on
# disk (quick); elsewhere any torch the index serves will do.
if ! "$PY" -c "import torch, transformers" 2>/dev/null; then
  "$PY" -m pip install -q torch==2.13.0 transformers tokenizers safetensors ||
    "$PY" -m pip install -q torch transformers tokenizers safetensors
fi

if ! wait "$base_pid"; then
  cat "$base_log" >&2
  echo "test.sh: envbuild base bootstrap failed" >&2
  exit 1
fi
stamp "venv and base ready; pytest starts"
# Two workers, a file at a time (module fixtures run once), files with slow tests first
# (tests/conftest.py): the image builds overlap the unit tests instead of following them.
set +e
"$PY" -m pytest -q -ra --durations=20 -n "${ENVBUILD_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
rc=$?
set -e
stamp "pytest done (exit $rc)"
[ "$rc" = 5 ] && { echo "test.sh: pytest collected no tests" >&2; exit 1; }
exit "$rc"
