"""Summaries of probe runs for the device-side bench scripts (probe_ab_h200.sh, probe_modes_h200.sh,
hf_probe_phases.sh): one printed line per run, and one JSON of all runs with their check lists.
    python3 bench/probe_runs.py line VERDICT.json TAG [RC WALL_S]   (RC, WALL_S are kept in the file)
    python3 bench/probe_runs.py collect DIR OUT.json
Standard library only: it runs with the node's own Python."""
import json
import pathlib
import sys

# The timings worth a glance, in the order the levels take them.
KEYS = ("process", "prefetch", "env", "import_torch", "contract", "import_verl", "contract_wait", "gpu",
        "build_model", "engine_start", "rollout", "update")


def line(path: str, tag: str, rc: str | None = None, wall: str | None = None) -> None:
    d = json.loads(pathlib.Path(path).read_text())
    if rc is not None:
        d["exit"], d["wall"] = int(rc), float(wall)
        pathlib.Path(path).write_text(json.dumps(d))
    t = d["timings"]
    print(tag, d["status"], len(d["checks"]), *(("wall", d["wall"]) if "wall" in d else ()),
          {k: t[k] for k in KEYS if k in t})


def collect(folder: str, out: str) -> None:
    runs = {}
    for f in sorted(pathlib.Path(folder).glob("*.json")):
        d = json.loads(f.read_text())
        runs[f.stem] = {"status": d["status"], **{k: d[k] for k in ("exit", "wall") if k in d},
                        "timings": d["timings"], "checks": [(c["name"], c["status"], c["level"]) for c in d["checks"]],
                        # where a level's time went, check by check (the slow ones)
                        "check_seconds": {c["name"]: c["seconds"] for c in d["checks"] if (c.get("seconds") or 0) >= 0.05}}
    pathlib.Path(out).write_text(json.dumps(runs, indent=1))
    lists = {json.dumps(sorted(r["checks"])) for r in runs.values()}
    print(f"{len(runs)} runs, {len(lists)} distinct check lists")


if __name__ == "__main__":
    {"line": line, "collect": collect}[sys.argv[1]](*sys.argv[2:])
