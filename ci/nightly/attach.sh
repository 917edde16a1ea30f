set -euo pipefail
umask 077
key="$RUNNER_TEMP/envbuild.key"
trap 'rm -f "$key"' EXIT
printf '%s\n' "$ENVBUILD_SIGNING_KEY" > "$key"
envbuild attach --results tonight --key "$key"
