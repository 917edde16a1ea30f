"""Child process of the contract level: `python -m <probe package>.worker static|ext ENGINE SYS_PATH`.
Prints one JSON object. Standard library only, nothing of the environment imported."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict

from .staticreport import static_report
from .extcheck import check_extensions
from .vocab import EXIT_BAD_INPUT


def main(argv: list[str]) -> int:
    job, engine, path = argv[0], argv[1], argv[2]
    try:
        os.nice(5)  # the parent's imports are the critical path; this reading fills idle cores
    except OSError:
        pass
    # The parent's module search path (set once this package is imported): the same installed
    # environment, not this child's.
    sys.path[:] = [p for p in path.split(os.pathsep) if p]
    import importlib
    importlib.invalidate_caches()
    t0 = time.perf_counter()
    if job == "static":
        out = static_report(engine)
    elif job == "ext":
        rep = check_extensions()
        out = {"scanned": rep.scanned, "problems": [asdict(p) for p in rep.problems],
               "driver_libs": sorted(rep.driver_libs), "optional_missing": sorted(rep.optional_missing),
               "other_torch": rep.other_torch}
    else:
        print(f"unknown job {job!r}", file=sys.stderr)
        return EXIT_BAD_INPUT
    out["seconds"] = round(time.perf_counter() - t0, 4)
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
