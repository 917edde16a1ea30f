set -euo pipefail
umask 077
key="$RUNNER_TEMP/envbuild.key"
trap 'rm -f "$key"' EXIT
printf '%s\n' "$ENVBUILD_SIGNING_KEY" > "$key"
# Only images of records their jobs signed get an attestation signed with the table key.
trust=()
if [ -n "${ENVBUILD_RECORD_PUBKEY:-}" ]; then
  printf '%s\n' "$ENVBUILD_RECORD_PUBKEY" > "$RUNNER_TEMP/record-pubkey.json"
  trust=(--record-pubkey "$RUNNER_TEMP/record-pubkey.json")
fi
envbuild attach --results tonight --key "$key" --signed-records "${trust[@]}"
