set -uo pipefail
if [ "$FOUND" != "true" ]; then
  echo "No published table yet at ${TABLE_URL}: nothing to compare." >> "$GITHUB_STEP_SUMMARY"
  exit 0
fi
# diff verifies both signatures against the trusted key: a published table that does not
# verify (exit 2) stops the run, so nothing is compared with or published over a forgery.
envbuild diff last table --pubkey trusted-pubkey.json --markdown diff.md --json > diff.json
rc=$?
if [ -f diff.md ]; then cat diff.md >> "$GITHUB_STEP_SUMMARY"; fi
# Regressions are published like any verdict; the notify job turns them red.
if [ "$rc" = 1 ]; then echo "::warning title=envbuild::regressions against the last published table (see the summary)"; exit 0; fi
exit "$rc"
