#!/usr/bin/env bash
# Start the services envbuild's real builds need, reusing whatever already answers:
#   - a Docker engine (dockerd without a bridge: every build and container uses the host network)
#   - a registry on 127.0.0.1:5000 (Debian's docker-registry, listening on loopback only)
# Idempotent: safe to run again; it installs missing Debian packages, never restarts a running
# service. Usage: ci/services.sh            (as root, or with sudo available)
# Env: ENVBUILD_REGISTRY_ADDR (default 127.0.0.1:5000), ENVBUILD_REGISTRY_DIR
#      (default /var/lib/envbuild-registry), ENVBUILD_STATE_DIR (logs, config; /var/lib/envbuild-services)
set -euo pipefail

REG_ADDR="${ENVBUILD_REGISTRY_ADDR:-127.0.0.1:5000}"
REG_DIR="${ENVBUILD_REGISTRY_DIR:-/var/lib/envbuild-registry}"
STATE="${ENVBUILD_STATE_DIR:-/var/lib/envbuild-services}"
SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "services.sh: needs root (or sudo) to start dockerd" >&2; exit 1; }
  SUDO="sudo"
fi
# Debian's client: it supports DOCKER_BUILDKIT=1 builds; a newer client earlier on PATH may not.
DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER="$(command -v docker || true)"

say() { echo "services.sh: $*"; }

wait_for() {  # wait_for SECONDS DESCRIPTION CMD...
  local secs="$1" what="$2"; shift 2
  for _ in $(seq 1 "$((secs * 2))"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  echo "services.sh: $what did not answer within ${secs}s" >&2
  return 1
}

# 1. Packages (only the missing ones, so a warm machine does not touch apt at all).
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-registry >/dev/null || missing+=(docker-registry)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # The package's own registry unit (if systemd runs) listens on all interfaces; ours is loopback-only.
  if command -v systemctl >/dev/null && systemctl is-active --quiet docker-registry 2>/dev/null; then
    $SUDO systemctl disable --now docker-registry || true
  fi
  [ -x /usr/bin/docker ] && DOCKER=/usr/bin/docker
fi
$SUDO mkdir -p "$STATE"

# 2. Docker engine: reuse one that answers; otherwise start dockerd without a bridge.
if $SUDO "$DOCKER" info >/dev/null 2>&1; then
  say "docker engine already answers (reused)"
else
  if pgrep -x dockerd >/dev/null; then
    say "a dockerd process exists but does not answer yet; waiting"
  else
    say "starting dockerd (--bridge=none, log $STATE/dockerd.log)"
    $SUDO sh -c "nohup dockerd --bridge=none --iptables=false --ip-masq=false \
      >>'$STATE/dockerd.log' 2>&1 </dev/null &"
  fi
  wait_for 60 "dockerd" $SUDO "$DOCKER" info || { tail -n 20 "$STATE/dockerd.log" >&2 || true; exit 1; }
  say "docker engine answers"
fi

# 3. Registry on loopback: reuse one that answers the v2 API.
reg_up() { curl -fs -m 2 "http://$REG_ADDR/v2/" >/dev/null; }
if reg_up; then
  say "registry at $REG_ADDR already answers (reused)"
else
  $SUDO mkdir -p "$REG_DIR"
  cfg="$STATE/registry.yml"
  # No auth, deletes allowed (tests clean up), loopback only: nothing else is a legitimate target.
  $SUDO tee "$cfg" >/dev/null <<YML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $REG_DIR
  delete:
    enabled: true
http:
  addr: $REG_ADDR
YML
  say "starting docker-registry on $REG_ADDR (storage $REG_DIR, log $STATE/registry.log)"
  $SUDO sh -c "nohup docker-registry serve '$cfg' >>'$STATE/registry.log' 2>&1 </dev/null &"
  wait_for 30 "registry at $REG_ADDR" reg_up || { tail -n 20 "$STATE/registry.log" >&2 || true; exit 1; }
  say "registry answers at $REG_ADDR"
fi
say "ready: docker=$DOCKER registry=$REG_ADDR"
