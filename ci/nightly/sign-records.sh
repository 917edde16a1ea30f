set -euo pipefail
umask 077
# The records this job wrote, signed before they leave the runner: publish folds only signed ones
# (an unsigned or changed file in the artifacts becomes no row). The record key is not the table
# key: a runner that holds it can sign records, never a table.
if [ -z "${ENVBUILD_RECORD_KEY:-}" ]; then
  echo "::error title=Records not signed::the secret ENVBUILD_RECORD_KEY is not set; publish folds only signed records (envbuild keygen --name record)"
  exit 1
fi
if [ ! -d "$RESULTS/records" ]; then
  echo "No records under $RESULTS: nothing to sign."
  exit 0
fi
key="$RUNNER_TEMP/envbuild-record.key"
trap 'rm -f "$key"' EXIT
printf '%s\n' "$ENVBUILD_RECORD_KEY" > "$key"
combo=()
if [ -n "${ID:-}" ]; then combo=(--combo "$ID"); fi
envbuild ci sign-records --results "$RESULTS" --job "$JOB" "${combo[@]}" --key "$key"
