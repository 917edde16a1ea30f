set -euo pipefail
umask 077
key="$RUNNER_TEMP/envbuild.key"
trap 'rm -f "$key"' EXIT
printf '%s\n' "$ENVBUILD_SIGNING_KEY" > "$key"
# Only records their jobs signed are folded: the earlier ones (signed by this key once the last
# table vouched for them) and tonight's (the record key's public half, ENVBUILD_RECORD_PUBKEY).
trust=()
if [ -n "${ENVBUILD_RECORD_PUBKEY:-}" ]; then
  printf '%s\n' "$ENVBUILD_RECORD_PUBKEY" > "$RUNNER_TEMP/record-pubkey.json"
  trust=(--record-pubkey "$RUNNER_TEMP/record-pubkey.json")
fi
envbuild publish --results results --key "$key" --out table --signed-records "${trust[@]}" 2> "$RUNNER_TEMP/publish.err" \
  || { cat "$RUNNER_TEMP/publish.err" >&2; exit 1; }
cat "$RUNNER_TEMP/publish.err" >&2
left=$(grep -c '^envbuild publish: not folded: ' "$RUNNER_TEMP/publish.err" || true)
if [ "$left" != 0 ]; then
  echo "::warning title=Records not folded::$left record(s) or signature(s) were left out (unsigned, changed, of another run or combination): see this step's log"
  echo "**$left record(s) or signature(s) not folded** (unsigned, changed, of another run or combination): see the publish step's log." >> "$GITHUB_STEP_SUMMARY"
fi
