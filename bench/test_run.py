"""Where the test command's time goes: reads logs of `bash ci/test.sh` (or `.ci/run`), each
labelled, and prints their phase stamps, pytest's total and its slowest tests side by side;
writes the same as JSON. Run the logs under the conditions you want compared (say, a clean
clone with Docker's build cache, the registry and ~/.cache emptied before each) and label them:

    python bench/test_run.py before=/tmp/ci-before.log after=/tmp/ci-after.log \\
        --note "2 cores, caches emptied before each" --out bench/test_run.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

STAMP = re.compile(r"^test\.sh: \[(\d+) s, load ([0-9.]+)\] (.*)$", re.M)
SUMMARY = re.compile(r"^=*\s*([^\n]*?\bpassed\b[^\n]*?) in ([0-9.]+)s", re.M)  # "3 failed, 698 passed, ... in 797.1s"
SLOW = re.compile(r"^([0-9.]+)s (call|setup|teardown)\s+(\S+)$", re.M)


def read(path: Path) -> dict:
    text = path.read_text(errors="replace")
    stamps = [{"s": int(s), "load": float(ld), "what": w} for s, ld, w in STAMP.findall(text)]
    m = [x for x in SUMMARY.finditer(text)]
    if not stamps or not m:
        sys.exit(f"{path}: no test.sh phase stamps or pytest summary (not a ci/test.sh log?)")
    last = m[-1]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (\w+)", last.group(1))}
    return {"log": path.name, "stamps": stamps, "counts": counts, "passed": counts.get("passed", 0),
            "pytest_s": float(last.group(2)), "total_s": stamps[-1]["s"],
            "slowest": [{"s": float(s), "when": w, "test": t} for s, w, t in SLOW.findall(text)]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", metavar="LABEL=LOG")
    ap.add_argument("--note", default="", help="the conditions (machine, caches, load)")
    ap.add_argument("--out", help="write the JSON here")
    a = ap.parse_args()
    runs = {}
    for arg in a.logs:
        label, sep, path = arg.partition("=")
        if not sep or not label:
            sys.exit(f"{arg}: give LABEL=LOG")
        runs[label] = read(Path(path))
    labels = list(runs)
    if a.out:  # before the table: a closed pipe must not lose it
        Path(a.out).write_text(json.dumps({"what": __doc__.splitlines()[0], "note": a.note, "runs": runs},
                                          indent=1) + "\n")
    w = max(14, *(len(x) + 2 for x in labels))
    print(f"{'':<44}" + "".join(f"{x:>{w}}" for x in labels))
    print(f"{'ci/test.sh, whole':<44}" + "".join(f"{runs[x]['total_s']:>{w - 2}} s" for x in labels))
    print(f"{'pytest':<44}" + "".join(f"{runs[x]['pytest_s']:>{w - 2}.0f} s" for x in labels))
    print(f"{'passed':<44}" + "".join(f"{runs[x]['passed']:>{w}}" for x in labels))
    tests = []
    for x in labels:
        for t in runs[x]["slowest"]:
            if (t["test"], t["when"]) not in tests:
                tests.append((t["test"], t["when"]))
    for test, when in tests[:25]:
        name = test.split("::")[-1][:36] + (f" ({when})" if when != "call" else "")
        cells = []
        for x in labels:
            hit = next((t["s"] for t in runs[x]["slowest"] if (t["test"], t["when"]) == (test, when)), None)
            cells.append(f"{hit:>{w - 2}.0f} s" if hit is not None else f"{'-':>{w}}")
        print(f"{name:<44}" + "".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
