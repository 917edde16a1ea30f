"""The long fuzz run (issues 14, 27): hostile matrices through `envbuild plan --matrix FILE`,
garbage where result records live through the record reader, and a hostile registry behind
`verify IMAGE@sha256:…` (wrong shapes, digests, statuses, broken HTTP framing).

The same generators and judge as tests/test_fuzz.py (tests/fuzz_inputs.py), for N tries instead
of a few hundred. Most tries run in-process (SIGALRM deadline, an audit hook for writes outside
the sandbox); every K-th runs as a real child process under a 1 GiB address-space limit, which
gives the peak RSS. Prints a table and writes JSON.

    python bench/fuzz.py [--tries 3000] [--seed 14] [--subprocess-every 50] [--out bench/fuzz.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fuzz_inputs import GENERATORS, garbage_record, run_inprocess, run_subprocess  # noqa: E402

from envbuild.record import iter_records, latest_by_combo  # noqa: E402

MAX_SECONDS = 10.0


def fuzz_plan(tries: int, seed: int, every: int) -> dict:
    kinds = sorted(GENERATORS)
    rows = {k: {"tries": 0, "exit": {}, "clean_errors": 0, "tracebacks": 0, "hangs": 0, "other_problems": 0,
                "max_seconds": 0.0, "max_rss_mb": 0.0, "subprocess_tries": 0} for k in kinds}
    examples: list[dict] = []
    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for i in range(tries):
        kind = kinds[i % len(kinds)]
        rnd = random.Random(f"{seed}-{i}")
        data = GENERATORS[kind](rnd)
        argv_extra = rnd.choice([[], ["--json"], ["--all"], ["--cuda", "cu124"], ["--hf"]])
        with tempfile.TemporaryDirectory(prefix="envbuild-fuzz-") as d:
            root = Path(d)
            (root / "m.yaml").write_bytes(data)
            argv = ["plan", "--matrix", str(root / "m.yaml"), *argv_extra]
            sub = every and i % every == 0
            out = run_subprocess(argv, root, 60, 1024) if sub else run_inprocess(argv, root, MAX_SECONDS)
        r = rows[kind]
        r["tries"] += 1
        r["subprocess_tries"] += bool(sub)
        r["exit"][str(out.rc)] = r["exit"].get(str(out.rc), 0) + 1
        problems = out.problems(60 if sub else MAX_SECONDS)
        r["tracebacks"] += bool(out.crash or "Traceback" in out.stderr)
        r["hangs"] += bool(out.hang or any(p.startswith("hang") for p in problems))
        r["other_problems"] += bool(problems) and not (out.crash or out.hang or "Traceback" in out.stderr)
        r["clean_errors"] += out.rc in (1, 2, 3) and not problems
        r["max_seconds"] = max(r["max_seconds"], round(out.seconds, 3))
        rss = out.rss_mb if sub else (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_kb) / 1024
        r["max_rss_mb"] = max(r["max_rss_mb"], round(rss, 1))
        if problems and len(examples) < 20:
            examples.append({"try": i, "kind": kind, "sha256": hashlib.sha256(data).hexdigest()[:16],
                             "problems": problems, "stderr": out.stderr[-300:]})
    return {"rows": rows, "examples": examples}


def fuzz_records(tries: int, seed: int) -> dict:
    counts = {"tries": tries, "iter_records_crashes": 0, "latest_by_combo_crashes": 0, "errors": {}}
    for i in range(tries):
        rnd = random.Random(f"records-{seed}-{i}")
        with tempfile.TemporaryDirectory(prefix="envbuild-fuzz-") as d:
            root = Path(d)
            for j in range(rnd.randint(1, 4)):
                p = root / "records" / f"c{j % 2}" / f"2026010{j}T000000-{j:06x}.json"
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(garbage_record(rnd))
            for name, fn in (("iter_records", lambda: list(iter_records(root))),
                             ("latest_by_combo", lambda: latest_by_combo(root))):
                try:
                    fn()
                except Exception as e:  # noqa: BLE001 - counting what escapes
                    counts[f"{name}_crashes"] += 1
                    key = f"{name}: {type(e).__name__}"
                    counts["errors"][key] = counts["errors"].get(key, 0) + 1
    return counts


def fuzz_registry(tries: int, seed: int) -> dict:
    """A hostile registry behind `verify IMAGE@…` (tests/fuzz_registry.py)."""
    from fuzz_registry import verify_against

    from envbuild.sign import write_keypair
    pub = write_keypair(Path(tempfile.mkdtemp(prefix="envbuild-fuzz-")) / "k")[1]
    out = {"tries": tries, "trust_failures": 0, "infrastructure": 0, "input": 0, "accepted": 0, "tracebacks": 0,
           "hangs": 0, "max_seconds": 0.0, "crashes": []}
    for i in range(tries):
        got, seconds = verify_against(f"registry-{seed}-{i}", pub, deadline=10)
        key = {"verify": "trust_failures", "infra": "infrastructure", "input": "input", "ok": "accepted"}.get(got)
        if key:
            out[key] += 1
        else:
            out["tracebacks"] += 1
            if len(out["crashes"]) < 10:
                out["crashes"].append(got)
        out["hangs"] += seconds > 15
        out["max_seconds"] = max(out["max_seconds"], round(seconds, 2))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=3000)
    ap.add_argument("--record-tries", type=int, default=1000)
    ap.add_argument("--registry-tries", type=int, default=500)
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--subprocess-every", type=int, default=50, help="every K-th try as a child process (0: never)")
    ap.add_argument("--out", default=str(Path(__file__).with_name("fuzz.json")))
    a = ap.parse_args()
    t0 = time.monotonic()
    plan = fuzz_plan(a.tries, a.seed, a.subprocess_every)
    records = fuzz_records(a.record_tries, a.seed)
    registry = fuzz_registry(a.registry_tries, a.seed)
    cols = ("tries", "clean_errors", "tracebacks", "hangs", "other_problems", "max_seconds", "max_rss_mb")
    print(f"{'matrix input':<12}" + "".join(f"{c:>15}" for c in cols) + "  exit codes")
    total = {c: 0 for c in cols}
    for kind, r in plan["rows"].items():
        print(f"{kind:<12}" + "".join(f"{r[c]:>15}" for c in cols) + "  " + json.dumps(r["exit"], sort_keys=True))
        for c in cols:
            total[c] = max(total[c], r[c]) if c.startswith("max") else total[c] + r[c]
    print(f"{'all':<12}" + "".join(f"{total[c]:>15}" for c in cols))
    print(f"records: {records['tries']} folders, iter_records crashed {records['iter_records_crashes']}, "
          f"latest_by_combo crashed {records['latest_by_combo_crashes']} {records['errors']}")
    print("registry: " + ", ".join(f"{k} {v}" for k, v in registry.items() if k != "crashes"))
    for ex in plan["examples"][:5]:
        print("example:", json.dumps(ex)[:400])
    doc = {"command": "python bench/fuzz.py " + " ".join(sys.argv[1:]), "seed": a.seed,
           "subprocess_every": a.subprocess_every, "max_seconds_in_process": MAX_SECONDS,
           "subprocess_limits": {"seconds": 60, "address_space_mb": 1024}, "total": total, **plan,
           "records": records, "registry": registry, "wall_seconds": round(time.monotonic() - t0, 1),
           "machine": {"python": platform.python_version(), "platform": platform.platform()}}
    Path(a.out).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {a.out}")
    return 1 if total["tracebacks"] or total["hangs"] or total["other_problems"] or registry["tracebacks"] \
        or registry["hangs"] else 0


if __name__ == "__main__":
    sys.exit(main())
