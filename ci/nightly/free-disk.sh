set -euo pipefail
df -h /
# Toolchains this job does not use (~25 GB): an image with its layers needs ~20 GB.
sudo rm -rf /usr/share/dotnet /usr/local/lib/android /opt/ghc /usr/local/share/boost /opt/hostedtoolcache/CodeQL
docker image prune --all --force > /dev/null
df -h /
