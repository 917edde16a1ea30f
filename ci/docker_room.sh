#!/usr/bin/env bash
# Make room for the test suite's images on a machine whose Docker state outlives a run.
#   bash ci/docker_room.sh [NEED_GB]      (default 40: a cold run grew the disk by 32 GB here)
# BuildKit's cache is kept between runs (warm builds), but Docker 20.10 keeps every record and the
# suite's uncached rebuild adds ~8 GB of new ones each run, so a machine running it often fills
# its disk (a CI run ended in "No space left on device" while pushing). So: 1. bound the cache to
# ENVBUILD_KEEP_CACHE_GB (default 25, least recently used first), drop dangling images and the
# registry's unreferenced blobs; 2. if the disk still has less than NEED_GB free, drop the whole
# build cache (the suite passes from a cold cache, only slower); 3. say what was freed, and warn
# loudly when it is still short. Never fails the run: a short disk is reported, not judged.
set -euo pipefail

need_gb="${1:-40}"
keep_gb="${ENVBUILD_KEEP_CACHE_GB:-25}"
DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER="$(command -v docker)"
root="$("$DOCKER" info --format '{{.DockerRootDir}}' 2>/dev/null || echo /var/lib/docker)"
free_gb() { df -P -B1G "$root" | awk 'NR == 2 {print $4}'; }
cache() { "$DOCKER" system df --format '{{.Type}} {{.Size}}' 2>/dev/null | sed -n 's/^Build Cache //p'; }
say() { echo "docker_room.sh: $*"; }

before=$(free_gb)
say "${before} GB free on ${root}'s disk, build cache $(cache); the suite needs about ${need_gb} GB"
"$DOCKER" builder prune -f --keep-storage "${keep_gb}GB" >/dev/null 2>&1 || true
"$DOCKER" image prune -f >/dev/null 2>&1 || true
cfg="${ENVBUILD_STATE_DIR:-/var/lib/envbuild-services}/registry.yml"
if [ -f "$cfg" ] && command -v docker-registry >/dev/null; then
  docker-registry garbage-collect "$cfg" >/dev/null 2>&1 || true
fi
if [ "$(free_gb)" -lt "$need_gb" ]; then
  say "$(free_gb) GB free after bounding the cache to ${keep_gb} GB: dropping the whole build cache"
  "$DOCKER" builder prune -af >/dev/null 2>&1 || true
fi
after=$(free_gb)
say "${after} GB free (was ${before} GB), build cache $(cache)"
if [ "$after" -lt "$need_gb" ]; then
  say "WARNING: only ${after} GB free for Docker and the registry; the end-to-end tests need about" \
      "${need_gb} GB and may fail with 'No space left on device'"
  # Docker 20.10's BuildKit can leave layer folders that no image, container or cache record holds
  # (measured here: 49 GB under overlay2 while `docker system df` said 0 B); no prune frees them.
  held=$("$DOCKER" system df --format '{{.Size}}' 2>/dev/null | awk '
    {v = $1 + 0; u = $1; sub(/^[0-9.]+/, "", u)
     s += (u == "TB") ? v * 1000 : (u == "GB") ? v : (u == "MB") ? v / 1000 : (u == "kB") ? v / 1e6 : 0}
    END {printf "%d", s}')
  layers=$(timeout 120 du -sx -B1G "$root/overlay2" 2>/dev/null | cut -f1 || true)
  if [ -n "$layers" ] && [ "$((layers - held))" -ge 5 ]; then
    say "WARNING: ${layers} GB of layer folders under $root/overlay2, of which Docker accounts for" \
        "${held} GB: the rest is held by nothing Docker lists; stopping dockerd and removing the" \
        "folders that no image holds frees it (with no images, all of $root/overlay2)"
  fi
fi
