#!/usr/bin/env python3
"""Build speed: a naive Dockerfile (one `RUN pip install -r lock.txt`) against envbuild's
rendering of the same combination, side by side from a cold cache, on the same base.

Prints a table and writes JSON (bench/build_speed.json by default):
  - cold build time of each and their ratio (goal: envbuild <= 0.3x naive)
  - image sizes (goal: envbuild smaller)
  - a second combination sharing torch, built after the first (goal: <= 0.05x a cold build)
    and the bytes each first image shares with it
  - a no-op rebuild of the already-built combinations (goal: <= 2 s per combination)

Needs a Docker engine and the package index (ci/services.sh); takes ~15 min and ~20 GB of disk,
and removes the images it built afterwards (--keep keeps them).

  python bench/build_speed.py [--cuda cu124 --vllm 0.8.4 --verl 0.4.1] [--second hf]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOALS = {"cold_ratio": 0.3, "second_ratio": 0.05, "noop_per_combo_s": 2.0}
NAIVE = """FROM {base}
COPY lock.txt /tmp/lock.txt
# The naive recipe: one venv, one pip install of the whole lock, pip's defaults (its cache
# included). --no-deps because the lock is complete, and pip's hash mode otherwise rejects an
# extra (fsspec[http]) that uv's lock lists without brackets. The CA bundle comes in as a
# secret only because this machine's proxy needs it.
RUN --mount=type=secret,id=ca-bundle,required=false \\
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi; \\
    python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-deps -r /tmp/lock.txt
ENV PATH=/opt/venv/bin:$PATH
"""


def envbuild(*args: str, env=None) -> tuple[float, subprocess.CompletedProcess]:
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "envbuild", *args], capture_output=True, text=True, env=env)
    return time.monotonic() - t, p


def latest(results: Path, combo_id: str):
    from envbuild.record import latest_by_combo

    return latest_by_combo(results)[combo_id]


def layer_sizes(engine, ref: str) -> list[tuple[str, int]]:
    """(diff id, bytes) of each layer, from the daemon's layer store (chain ids), so sharing is
    counted exactly; falls back to streaming `docker save` where that store cannot be read."""
    diffs = engine.layers(ref)
    info = engine.cmd("info", "--format", "{{.DockerRootDir}} {{.Driver}}").stdout.split()
    root = Path(info[0]) / "image" / info[1] / "layerdb" / "sha256"
    out, chain = [], None
    for d in diffs:
        chain = d if chain is None else "sha256:" + hashlib.sha256(f"{chain} {d}".encode()).hexdigest()
        p = root / chain.split(":", 1)[1] / "size"
        if not p.is_file():
            return _sizes_from_save(engine, ref)
        out.append((d, int(p.read_text().strip())))
    return out


def _sizes_from_save(engine, ref: str) -> list[tuple[str, int]]:
    import tarfile

    proc = subprocess.Popen([engine.client, "save", ref], stdout=subprocess.PIPE)
    sizes, manifest = {}, None
    with tarfile.open(fileobj=proc.stdout, mode="r|") as t:
        for m in t:
            if m.name.endswith("layer.tar"):
                sizes[m.name] = m.size
            elif m.name == "manifest.json":
                manifest = json.load(t.extractfile(m))
    proc.wait()
    return list(zip(engine.layers(ref), (sizes[n] for n in manifest[0]["Layers"])))


def shared_bytes(a: list[tuple[str, int]], b: list[tuple[str, int]]) -> int:
    """Bytes of the common layer prefix (a layer is shared only if everything below it is)."""
    n = 0
    for (da, sa), (db, _) in zip(a, b):
        if da != db:
            break
        n += sa
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuda", default="cu124")
    ap.add_argument("--vllm", default="0.8.4")
    ap.add_argument("--verl", default="0.4.1")
    ap.add_argument("--second", default="hf", help="hf, or a vLLM version sharing the torch of the first")
    ap.add_argument("--out", default=str(HERE / "build_speed.json"))
    ap.add_argument("--keep", action="store_true", help="keep the images built and the build cache")
    args = ap.parse_args(argv)

    from envbuild.base import bootstrap
    from envbuild.build import default_ca_bundle
    from envbuild.docker import detect
    from envbuild.index import Metadata
    from envbuild.lock import Locker
    from envbuild.matrix import load_matrix, plan, Selectors
    from envbuild.paths import default_matrix

    engine = detect()
    base = bootstrap(engine, log=lambda s: print(s, file=sys.stderr)).ref
    meta = Metadata()
    m = load_matrix(default_matrix())
    sel_a = ["--cuda", args.cuda, "--vllm", args.vllm, "--verl", args.verl]
    a = plan(m, Selectors(cuda=args.cuda, vllm=args.vllm, verl=args.verl), meta).combos[0]
    if args.second == "hf":
        sel_b = ["--cuda", args.cuda, "--hf", "--torch", a.torch, "--verl", args.verl]
        b = plan(m, Selectors(cuda=args.cuda, hf=True, torch=a.torch, verl=args.verl), meta).combos[0]
    else:
        sel_b = ["--cuda", args.cuda, "--vllm", args.second, "--verl", args.verl]
        b = plan(m, Selectors(cuda=args.cuda, vllm=args.second, verl=args.verl), meta).combos[0]
    assert b.torch == a.torch, f"the second combination must share torch {a.torch}, has {b.torch}"

    work = Path(tempfile.mkdtemp(prefix="envbuild-bench-"))
    results = work / "results"
    common = ["--base", "bootstrap", "--results", str(results)]
    lock = Locker(m, meta).lock(a, work / "locks")
    assert lock.ok, lock.detail
    ca = default_ca_bundle()
    images: list[str] = []
    out: dict = {"combo": a.id, "second": b.id, "base": base, "engine": engine.describe(),
                 "cpus": os.cpu_count(), "goals": GOALS}
    try:
        # Cold: no image, no layer cache, no download cache for either side. (A layer cache left
        # by earlier builds would also hand the second combination layers other than the fresh
        # ones of the first, so it is emptied, not just bypassed.)
        _cold(engine)
        ctx = work / "naive"
        ctx.mkdir()
        (ctx / "Dockerfile").write_text(NAIVE.format(base=base))
        (ctx / "lock.txt").write_text(Path(lock.full_lock).read_text())
        naive_ref = f"envbuild-bench/naive:{a.tag}"
        print(f"naive cold build of {a.id} ...", file=sys.stderr)
        res = engine.build(ctx, log_path=work / "naive.log", tags=[naive_ref], no_cache=True,
                           secrets={"ca-bundle": ca} if ca else {}, timeout=3600)
        assert res.ok, (work / "naive.log").read_text()[-3000:]
        images.append(naive_ref)
        out["naive"] = {"seconds": round(res.seconds, 1), "size": engine.image_size(naive_ref)}

        _cold(engine)
        print(f"envbuild cold build of {a.id} ...", file=sys.stderr)
        secs, p = envbuild("build", *sel_a, *common, "--rebuild", "--no-cache")
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        ra = latest(results, a.id)
        images += ra.image["tags"]
        out["envbuild"] = {"seconds": round(secs, 1), "build_seconds": ra.timings.get("build"),
                           "size": ra.image["size"], "ref": ra.image["ref"]}

        print(f"envbuild build of the second combination {b.id} ...", file=sys.stderr)
        secs_b, p = envbuild("build", *sel_b, *common, "--rebuild")
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        rb = latest(results, b.id)
        images += rb.image["tags"]
        out["second"] = {"seconds": round(secs_b, 1), "build_seconds": rb.timings.get("build"),
                         "size": rb.image["size"], "ref": rb.image["ref"]}

        la, lb, ln = (layer_sizes(engine, r) for r in (ra.image["ref"], rb.image["ref"], naive_ref))
        # A naive image shares only its base with any other combination: its one RUN layer
        # differs as soon as the lock does.
        out["shared_bytes"] = {"envbuild": shared_bytes(la, lb), "naive": shared_bytes(ln, lb)}
        out["layers"] = {"envbuild": len(la), "second": len(lb), "naive": len(ln)}

        noop = []
        for sel, c in ((sel_a, a), (sel_b, b)):
            s, p = envbuild("build", *sel, *common)
            assert p.returncode == 0 and latest(results, c.id).image["reused"], p.stdout[-2000:]
            noop.append(round(s, 2))
        out["noop_seconds"] = noop
    finally:
        if not args.keep:
            engine.remove(*images, force=True)
            _prune_own_cache(engine)
        out["work"] = str(work)

    n, e, s2 = out["naive"], out["envbuild"], out["second"]
    out["ratios"] = {"cold": round(e["seconds"] / n["seconds"], 3),
                     "second": round(s2["seconds"] / e["seconds"], 3),
                     "size": round(e["size"] / n["size"], 3)}
    out["measured"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    gb = 1e9
    rows = [
        ("naive cold build (one RUN pip install)", f"{n['seconds']:.0f} s", f"{n['size'] / gb:.2f} GB", ""),
        ("envbuild cold build", f"{e['seconds']:.0f} s", f"{e['size'] / gb:.2f} GB",
         f"{out['ratios']['cold']:.2f}x naive (goal <= {GOALS['cold_ratio']})"),
        (f"second combination ({b.engine_label or b.engine})", f"{s2['seconds']:.0f} s", f"{s2['size'] / gb:.2f} GB",
         f"{out['ratios']['second']:.3f}x cold (goal <= {GOALS['second_ratio']})"),
        ("bytes shared with the second: envbuild", "", f"{out['shared_bytes']['envbuild'] / gb:.2f} GB", ""),
        ("bytes shared with the second: naive", "", f"{out['shared_bytes']['naive'] / gb:.2f} GB", "(base only)"),
        ("no-op rebuild, per combination", " / ".join(f"{x:.1f} s" for x in noop), "",
         f"goal <= {GOALS['noop_per_combo_s']} s"),
    ]
    w = max(len(r[0]) for r in rows)
    print(f"{'':<{w}}  {'time':>12}  {'size':>9}  note")
    for r in rows:
        print(f"{r[0]:<{w}}  {r[1]:>12}  {r[2]:>9}  {r[3]}")
    Path(args.out).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _cold(engine) -> None:
    """Empty the build cache envbuild's steps made (layers and the uv download cache mount) and
    nothing else; check that no download cache of envbuild's is left."""
    _prune_own_cache(engine)
    left = [e for e in engine.cache_entries() if e.get("CacheType") == "exec.cachemount"
            and "/opt/envbuild/" in e.get("Description", "")]
    assert not left, f"could not empty envbuild's download cache: {left}"


def _prune_own_cache(engine) -> None:
    """Drop the build cache this benchmark's kind of builds made (envbuild's steps, the naive
    install) and only that: records whose step names envbuild's paths, plus every record built
    on top of one (COPY results name no path, but pin their parents). Children go first."""
    marks = ("/opt/envbuild/", "/tmp/lock.txt", "envbuild_probe")
    for _ in range(4):
        entries = engine.cache_entries()
        own = {e["ID"] for e in entries if any(k in e.get("Description", "") for k in marks)}
        grew = True
        while grew:
            kids = {e["ID"] for e in entries if e.get("Parent") in own} - own
            own |= kids
            grew = bool(kids)
        if not own:
            return
        parent = {e["ID"]: e.get("Parent") for e in entries}

        def depth(i, seen=0):
            return 0 if parent.get(i) not in own or seen > 64 else 1 + depth(parent[i], seen + 1)
        engine.prune_cache(sorted(own, key=depth, reverse=True))


if __name__ == "__main__":
    sys.exit(main())
