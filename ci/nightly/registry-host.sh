set -euo pipefail
echo "host=${ENVBUILD_REPOSITORY%%/*}" >> "$GITHUB_OUTPUT"
