set -euo pipefail
repo="${ENVBUILD_REPOSITORY:-ghcr.io/${GITHUB_REPOSITORY,,}}"
echo "repository=$repo" >> "$GITHUB_OUTPUT"
echo "Images go to $repo (set the variable ENVBUILD_REPOSITORY to change it)." >> "$GITHUB_STEP_SUMMARY"
