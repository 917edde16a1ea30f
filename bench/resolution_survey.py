"""Does the order of requirements decide a lock? (issue 26, class 8)

For every combination of the bundled matrix (or the selected ones), resolve it twice with the same
era, index and platform: envbuild's lock (the top of the stack first, torch pinned by the matrix,
the engine's runtime extras), and what `pip install verl==V ENGINE==E` asks for (no torch pin, no
extras). Every package whose version differs is listed with a reason where one is known:

    torch-pin     the matrix pins torch (or its variant); the reference takes what the engine allows
    extras        only the engine's runtime extras bring it in (sglang[srt])
    follows-torch a package torch pins exactly, moved with torch
    unexplained   anything else: a candidate for the row's notes, or a fix

    python bench/resolution_survey.py [-j 2] [--platform linux/amd64] [selectors...] [--out bench/resolution_survey.json]

Prints a table and writes JSON next to itself.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _via(text: str) -> dict[str, set[str]]:
    """uv's `# via` comments: package -> the packages (or -r files) that require it."""
    import re
    out: dict[str, set[str]] = {}
    cur = None
    in_via = False
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==", line)
        if m:
            cur, in_via = m.group(1).lower().replace("_", "-"), False
            out.setdefault(cur, set())
            continue
        s = line.strip()
        if cur and s.startswith("# via"):
            rest = s[len("# via"):].strip()
            if rest:
                out[cur].add(rest.split()[0].lower())
            in_via = True
        elif cur and in_via and s.startswith("#   "):
            out[cur].add(s[4:].split()[0].lower())
        elif cur and in_via and s.startswith("#") and s[1:].strip():
            out[cur].add(s[1:].strip().split()[0].lower())
    return out


def _reaches(text: str, root: str) -> set[str]:
    """Packages required, directly or through others, by `root`."""
    via = _via(text)
    side, grew = set(), True
    while grew:
        grew = False
        for name, parents in via.items():
            if name not in side and (root in parents or parents & side):
                side.add(name)
                grew = True
    return side


def survey_one(locker, c) -> dict:
    from envbuild.index_config import torch_source
    from envbuild.lockfile import parse_lock
    from envbuild.probe.vocab import ENGINE, dist_of
    from envbuild.probe.hardware import platform_machine

    t0 = time.monotonic()
    res = locker.lock(c)
    out = {"id": c.id, "lock": res.status}
    if res.status != "ok":
        out["detail"] = res.detail[-300:]
        return out
    src = torch_source(c.cuda, c.torch, locker.meta, locker.matrix.pytorch_index, platform_machine(c.platform))
    ref_reqs = [f"verl=={c.verl}"] + ([f"{dist_of(c.engine)}=={c.engine_version}"] if ENGINE[c.engine].versioned else [])
    when = res.era
    ref = locker._compile(ref_reqs, when, c, src, {}, hashes=False)
    out["reference"] = ref["status"]
    if ref["status"] != "ok":
        out["detail"] = ref["text"][-300:]
        return out
    mine = {n: v for n, (v, _) in parse_lock(res.full_lock).items()}
    theirs = {n: v for n, (v, _) in parse_lock(ref["text"]).items()}
    torch_side = _reaches(res.full_lock, "torch") | _reaches(ref["text"], "torch")
    engine_pins = _via(res.full_lock)  # who requires what in envbuild's lock (the extras' pins say the engine)
    diffs = []
    for n in sorted(set(mine) | set(theirs)):
        a, b = mine.get(n), theirs.get(n)
        if a == b:
            continue
        if n == "torch":
            why = "torch-pin"
        elif b is None and a is not None:
            why = "extras" if ENGINE[c.engine].runtime_extras else "unexplained"
        elif ENGINE[c.engine].runtime_extras and dist_of(c.engine) in engine_pins.get(n, set()):
            why = "extras"  # the engine's runtime extra pins it (sglang[srt] pins transformers)
        elif n in torch_side and mine.get("torch") != theirs.get("torch"):
            why = "follows-torch"
        else:
            why = "unexplained"
        diffs.append({"package": n, "envbuild": a, "reference": b, "why": why})
    out.update(diffs=diffs, era=when, seconds=round(time.monotonic() - t0, 1))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "resolution_survey.json"))
    from envbuild.selector import add_selector_args, selectors_from_args
    add_selector_args(ap)
    args = ap.parse_args()
    from envbuild.index import Metadata
    from envbuild.lock import Locker
    from envbuild.matrix import load_matrix
    from envbuild.expand import plan
    from envbuild.paths import default_matrix

    m = load_matrix(args.matrix or default_matrix())
    meta = Metadata()
    combos = plan(m, selectors_from_args(args), meta).combos
    locker = Locker(m, meta)
    t0 = time.monotonic()
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda c: survey_one(locker, c), combos))
    counts: dict[str, int] = {}
    for r in rows:
        for d in r.get("diffs", []):
            counts[d["why"]] = counts.get(d["why"], 0) + 1
    differ = [r for r in rows if r.get("diffs")]
    unexplained = [r for r in rows if any(d["why"] == "unexplained" for d in r.get("diffs", []))]
    summary = {"combinations": len(rows), "resolved_both": sum(1 for r in rows if r.get("reference") == "ok"),
               "differ": len(differ), "with_unexplained": len(unexplained), "by_reason": counts,
               "seconds": round(time.monotonic() - t0, 1)}
    Path(args.out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
    print(f"{'combination':<58} {'lock':<14} {'reference':<14} differences")
    for r in rows:
        ds = ", ".join(f"{d['package']} {d['envbuild']}|{d['reference']} ({d['why']})" for d in r.get("diffs", []))
        print(f"{r['id']:<58} {r['lock']:<14} {r.get('reference', '-'):<14} {ds or '-'}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
