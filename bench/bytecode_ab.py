#!/usr/bin/env python3
"""dockerfiles/compile-bytecode.py at a git revision against the working tree's, on one layer's
distributions in a container (the overlay a build step writes into), interleaved: a cold cache
(everything compiled, as in a cold build) and a warm one (every .pyc from the cache, as in a second
combination's verl step).

    python bench/bytecode_ab.py LAYER_LOCK [--build-constraints FILE] [--base HEAD] [--rounds 5]
                                [--out bench/bytecode_ab.json]

LAYER_LOCK is a layer lock from a rendered context (e.g. results/contexts/<combo>/locks/verl.txt).
The distributions are installed once, without bytecode, into /opt/venv of an image made from the
bootstrapped base; each run is a fresh container of that image, its sources read once beforehand
(a step's sources are in the page cache: uv just wrote them). Containers are removed only at the
end: on a disk mounted with `discard` (this machine) removing a container's gigabyte slows the
writes that follow it for tens of seconds, and would be measured. The first round is dropped.
Needs the Docker engine and the package index (ci/services.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRIPT = "dockerfiles/compile-bytecode.py"
STEP_ENV = ["-e", "SOURCE_DATE_EPOCH=946684800", "-e", "PYTHONHASHSEED=0"]  # as every install step
LINE = re.compile(r"envbuild: bytecode for (\d+) files .*?(\d+) compiled.* in ([0-9.]+) s")


def sh(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, text=True, capture_output=True, **kw)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lock")
    ap.add_argument("--build-constraints")
    ap.add_argument("--base", default="HEAD")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "bytecode_ab.json"))
    args = ap.parse_args(argv)

    from envbuild.base import bootstrap
    from envbuild.docker import detect
    from envbuild.index_config import uv_exe

    engine = detect()
    base = bootstrap(engine, log=lambda s: print(s, file=sys.stderr))
    work = Path(tempfile.mkdtemp(prefix="envbuild-pycab-"))
    rev = sh("git", "-C", str(ROOT), "rev-parse", "--short", args.base).stdout.strip()
    (work / "before.py").write_text(sh("git", "-C", str(ROOT), "show", f"{args.base}:{SCRIPT}").stdout)
    shutil.copy(ROOT / SCRIPT, work / "after.py")
    shutil.copy(ROOT / "dockerfiles/settle-overlaps.py", work / "settle-overlaps.py")
    shutil.copy(args.lock, work / "layer.txt")
    bc = ""
    if args.build_constraints:
        shutil.copy(args.build_constraints, work / "bc.txt")
        bc = "--build-constraints /w/bc.txt"
    image, tag, made = f"envbuild-bench/bytecode-ab:{os.getpid()}", f"envbuild-pycab-{os.getpid()}", []
    ca = os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt"
    env = [f"-e{k}={v}" for k, v in os.environ.items() if k in ("UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_EXTRA_INDEX_URL")]
    try:
        made.append(f"{tag}-mk")
        sh(engine.client, "run", "--name", f"{tag}-mk", "--network", "host", "-v", f"{work}:/w",
           "-v", f"{uv_exe()}:/usr/local/bin/uv:ro", "-v", f"{ca}:/ca.crt:ro", "-e", "SSL_CERT_FILE=/ca.crt", *env,
           base.pinned, "sh", "-c", "python3 -m venv /opt/venv && UV_LINK_MODE=copy uv pip install -q --python "
           f"/opt/venv/bin/python --cache-dir /w/uv --no-deps --require-hashes -r /w/layer.txt {bc}")
        sh(engine.client, "commit", made[0], image)
        (work / "warm").mkdir()

        def run(side: str, cache: str, label: str) -> dict:
            name = f"{tag}-{label}"
            made.append(name)
            subprocess.run(["sync"], check=False)
            time.sleep(2)
            p = sh(engine.client, "run", "--name", name, "--network", "host", "-v", f"{work}:/w", *STEP_ENV, image,
                   "sh", "-c", f"mkdir -p /tmp/cold; find /opt/venv /w/warm -type f -exec cat {{}} + >/dev/null; "
                   f"/opt/venv/bin/python -I /w/{side}.py /w/layer.txt {cache}")
            m = LINE.search(p.stdout)
            assert m, p.stdout + p.stderr
            return {"files": int(m.group(1)), "compiled": int(m.group(2)), "seconds": float(m.group(3))}

        run("after", "/w/warm", "fill")  # the warm cache: entries are the same format on both sides
        runs: dict[str, list[dict]] = {f"{s}-{c}": [] for s in ("before", "after") for c in ("cold", "warm")}
        for r in range(args.rounds + 1):
            for side in (("before", "after") if r % 2 else ("after", "before")):
                for cache, kind in (("/w/warm", "warm"), ("/tmp/cold", "cold")):
                    res = run(side, cache, f"{r}-{side}-{kind}")
                    print(f"round {r} {side:6} {kind}: {res['seconds']} s ({res['compiled']} compiled)",
                          file=sys.stderr)
                    if r:  # round 0 warms the machine up
                        runs[f"{side}-{kind}"].append(res)
    finally:
        for name in made:
            subprocess.run([engine.client, "rm", "-f", name], capture_output=True)
        subprocess.run([engine.client, "rmi", "-f", image], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    med = {k: round(statistics.median(r["seconds"] for r in v), 2) for k, v in runs.items()}
    out = {"measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "base": f"{args.base} ({rev})",
           "lock": args.lock, "files": runs["after-warm"][0]["files"], "cpus": os.cpu_count(),
           "load_after": round(os.getloadavg()[0], 2), "median": med, "runs": runs}
    print(f"{'cache':<8}{'before':>10}{'after':>10}")
    for kind in ("cold", "warm"):
        print(f"{kind:<8}{med[f'before-{kind}']:>10}{med[f'after-{kind}']:>10}")
    Path(args.out).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
