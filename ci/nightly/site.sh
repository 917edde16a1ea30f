set -euo pipefail
rm -rf site
mkdir site
cp -RL table/. site/  # publish's --out is a link to the current set of files (results.tar.gz among them)
mkdir -p site/history
# The earlier tables that verified with the CI key (envbuild ci earlier), plain files only.
find "$RUNNER_TEMP/history" -maxdepth 1 -type f -name '*.compat.json.dsse' -exec cp {} site/history/ \; 2>/dev/null || true
if [ "$FOUND" = "true" ]; then
  stamp="$(python -c 'import json,re,sys; print(re.sub(r"[^0-9TZ]", "", json.load(open(sys.argv[1]))["generated"]))' last/compat.json)"
  cp last/compat.json.dsse "site/history/${stamp}.compat.json.dsse"
fi
# Keep the newest $HISTORY_KEEP tables; index.json lists them, newest first.
find site/history -maxdepth 1 -name '*.compat.json.dsse' -printf '%f\n' | sort -r | tail -n "+$((HISTORY_KEEP + 1))" \
  | while read -r old; do rm -f "site/history/$old"; done
python -c 'import json,os,sys; d=sys.argv[1]; json.dump(sorted((f for f in os.listdir(d) if f.endswith(".compat.json.dsse")), reverse=True), open(os.path.join(d, "index.json"), "w"), indent=1)' site/history
tar -czf site/history.tar.gz -C site/history .
echo "Site: $(find site -type f | wc -l) files, $(find site/history -name '*.dsse' | wc -l) earlier table(s) in history/" >> "$GITHUB_STEP_SUMMARY"
