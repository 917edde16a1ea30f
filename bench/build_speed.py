#!/usr/bin/env python3
"""Build speed: a naive Dockerfile (one `RUN pip install -r lock.txt`) against envbuild's
rendering of the same combination, side by side from a cold cache, on the same base.

Prints a table and writes JSON (bench/build_speed.json by default):
  - cold build time of each and their ratio (goal: envbuild <= 0.35x naive, GOALS)
  - image sizes (goal: envbuild smaller)
  - a second combination sharing torch, built after the first (goal: <= 0.08x the cold build)
    and the bytes each first image shares with it
  - a no-op rebuild of the already-built combinations (goal: <= 2 s per combination)
  - push to the local registry, against the floors measured in the same run (reading the image;
    reading it through zstd on every core): envbuild's image uncompressed (the default to a
    loopback registry), zstd and gzip, the second combination after it, the naive image with gzip
  - torch-pair: two torch releases of one CUDA variant (hf, default 2.5.1 and 2.6.0 on cu124),
    the second built with --no-cache so equal layers come from equal bytes, not from the cache:
    which layers (CUDA libraries) have the same digest, and the bytes they share

Needs a Docker engine and the package index (ci/services.sh); takes ~30 min and ~30 GB of disk,
and removes the images it built afterwards (--keep keeps them); pushed repositories are named
envbuild-bench/<run>-* in the registry.

  python bench/build_speed.py [--cuda cu124 --vllm 0.8.4 --verl 0.4.1] [--second hf]
                              [--sections cold,push,torch-pair] [--registry 127.0.0.1:5000]
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
# issue #30's aims (the cold build against the naive recipe, the second combination against the cold build)
GOALS = {"cold_ratio": 0.35, "second_ratio": 0.08, "noop_per_combo_s": 2.0}
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


def cpu_times() -> tuple[float, float]:
    """(busy, iowait) CPU-seconds of the whole machine since boot, from /proc/stat: a build's work
    runs in dockerd, BuildKit and the step containers, not in this process's children."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle, iowait = fields[3], fields[4]
    return (sum(fields[:8]) - idle - iowait) / hz, iowait / hz


def cpu_used(before: tuple[float, float]) -> dict:
    """CPU-seconds the machine spent busy since `before`, and the wall time that work needs at the
    least on every core (busy / cores): a build can get no faster than that by overlapping alone."""
    busy, iowait = (round(a - b, 1) for a, b in zip(cpu_times(), before))
    return {"cpu_busy_s": busy, "cpu_iowait_s": iowait, "cpu_floor_s": round(busy / (os.cpu_count() or 1), 1),
            "load": _load()}


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
    ap.add_argument("--sections", default="cold,push,torch-pair",
                    help="comma-separated: cold (naive vs envbuild, second, no-op), push, torch-pair")
    ap.add_argument("--registry", default="127.0.0.1:5000", help="registry for the push section")
    ap.add_argument("--torch-pair", default="2.5.1,2.6.0", help="two torch releases of --cuda (hf, --verl)")
    args = ap.parse_args(argv)
    sections = set(args.sections.split(","))

    from envbuild.base import bootstrap
    from envbuild.build import default_ca_bundle
    from envbuild.docker import detect
    from envbuild.index import Metadata
    from envbuild.lock import Locker
    from envbuild.matrix import load_matrix
    from envbuild.expand import plan
    from envbuild.selector import Selectors
    from envbuild.paths import default_matrix

    engine = detect()
    base = bootstrap(engine, log=lambda s: print(s, file=sys.stderr)).ref
    meta = Metadata()
    m = load_matrix(default_matrix())
    sel_a = ["--cuda", args.cuda, "--vllm", args.vllm, "--verl", args.verl]
    a = plan(m, Selectors(cuda=args.cuda, engine="vllm", engine_version=args.vllm, verl=args.verl), meta).combos[0]
    if args.second == "hf":
        sel_b = ["--cuda", args.cuda, "--hf", "--torch", a.torch, "--verl", args.verl]
        b = plan(m, Selectors(cuda=args.cuda, engine="hf", torch=a.torch, verl=args.verl), meta).combos[0]
    else:
        sel_b = ["--cuda", args.cuda, "--vllm", args.second, "--verl", args.verl]
        b = plan(m, Selectors(cuda=args.cuda, engine="vllm", engine_version=args.second, verl=args.verl), meta).combos[0]
    assert b.torch == a.torch, f"the second combination must share torch {a.torch}, has {b.torch}"

    work = Path(tempfile.mkdtemp(prefix="envbuild-bench-"))
    results = work / "results"
    common = ["--base", "bootstrap", "--results", str(results)]
    lock = Locker(m, meta).lock(a, work / "locks")
    assert lock.ok, lock.detail
    # The second's lock too: no timed build includes resolution (the naive one needs the lock first).
    assert Locker(m, meta).lock(b, work / "locks").ok
    ca = default_ca_bundle()
    images: list[str] = []
    out: dict = {"combo": a.id, "second": b.id, "base": base, "engine": engine.describe(),
                 "cpus": os.cpu_count(), "goals": GOALS}
    out["sections"] = sorted(sections)
    try:
        if "torch-pair" in sections:
            out["torch_pair"] = torch_pair(engine, m, meta, base, args, work, images, ca)
        if "cold" in sections:
            cold_section(engine, a, b, sel_a, sel_b, common, results, lock, base, work, images, ca, out)
        if "push" in sections:
            ref = out.get("envbuild", {}).get("ref") or out.get("torch_pair", {}).get("refs", [None])[-1]
            out["push"] = push_section(engine, args.registry, ref, out.get("naive_ref"), images,
                                       out.get("second", {}).get("ref"))
    finally:
        if not args.keep:
            engine.remove(*images, force=True)
            _prune_own_cache(engine)
        out["work"] = str(work)
    out["measured"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print_table(out, a, b)
    Path(args.out).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def cold_section(engine, a, b, sel_a, sel_b, common, results, lock, base, work, images, ca, out) -> None:
    if True:
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
        out["naive"] = {"seconds": round(res.seconds, 1), "size": engine.image_size(naive_ref), "load": _load()}

        _cold(engine)
        print(f"envbuild cold build of {a.id} ...", file=sys.stderr)
        secs, p = envbuild("build", *sel_a, *common, "--rebuild", "--no-cache")
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        ra = latest(results, a.id)
        images += ra.image["tags"]
        out["envbuild"] = {"seconds": round(secs, 1), "build_seconds": ra.timings.get("build"),
                           "size": ra.image["size"], "ref": ra.image["ref"], "load": _load()}

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
        out["naive_ref"] = naive_ref
    n, e, s2 = out["naive"], out["envbuild"], out["second"]
    out["ratios"] = {"cold": round(e["seconds"] / n["seconds"], 3),
                     "second": round(s2["seconds"] / e["seconds"], 3),
                     "size": round(e["size"] / n["size"], 3)}


def torch_pair(engine, m, meta, base_ref, args, work, images, ca) -> dict:
    """Two torch releases of one CUDA variant, hf: the CUDA-library layers they share, by digest.
    Both are built with --no-cache, so an equal digest means equal bytes written by two fresh
    installs, not a cache hit."""
    import dataclasses

    from envbuild.values import Base
    from envbuild.index_config import default_index_url
    from envbuild.lock import Locker
    from envbuild.expand import plan
    from envbuild.selector import Selectors
    from envbuild.render import render_combo

    t1, t2 = args.torch_pair.split(",")
    c0 = plan(m, Selectors(cuda=args.cuda, engine="hf", verl=args.verl), meta).combos[0]
    locker = Locker(m, meta)
    res: dict = {"cuda": args.cuda, "torch": [t1, t2], "refs": [], "builds": []}
    layers = []
    # Both with --no-cache (no layer from the cache); the download cache stays warm: this
    # section measures sharing, the cold section measures time.
    for i, t in enumerate((t1, t2)):
        c = dataclasses.replace(c0, torch=t)
        lock = locker.lock(c, work / "pair-locks")
        assert lock.ok, f"{c.id}: {lock.status} {lock.detail[:500]}"
        r = render_combo(c, lock, Base("bootstrap", base_ref), work / "pair")
        ref = f"envbuild-bench/pair:{c.tag}"
        secrets = {"ca-bundle": ca} if ca else {}
        idx = default_index_url()
        with _secret_files({"index-url": idx} if idx else {}) as sf:
            print(f"torch-pair: building {c.id} (--no-cache) ...", file=sys.stderr)
            b = engine.build(r.context_dir, dockerfile=r.dockerfile, log_path=work / f"pair-{t}.log", tags=[ref],
                             secrets={**secrets, **sf}, no_cache=True, timeout=3600)
        assert b.ok, (work / f"pair-{t}.log").read_text()[-3000:]
        images.append(ref)
        res["refs"].append(ref)
        res["builds"].append({"combo": c.id, "seconds": round(b.seconds, 1), "size": engine.image_size(ref),
                              "layers": [l.name for l in r.model.layers]})
        layers.append(list(zip(_layer_names(engine, ref, base_ref, r.model), layer_sizes(engine, ref))))
    (la, lb) = layers
    da = {d: (name, size) for name, (d, size) in la}
    shared = [(name, size, d) for name, (d, size) in lb if d in da]
    res["layers"] = {"first": [{"name": n, "diff_id": d, "bytes": s} for n, (d, s) in la],
                     "second": [{"name": n, "diff_id": d, "bytes": s} for n, (d, s) in lb]}
    res["shared"] = [{"name": n, "bytes": s, "diff_id": d} for n, s, d in shared]
    res["shared_bytes"] = sum(s for _, s, _ in shared)
    res["shared_cuda_bytes"] = sum(s for n, s, _ in shared if n.startswith("cuda-"))
    res["second_bytes"] = sum(s for _, (_, s) in lb)
    return res


def _layer_names(engine, ref: str, base_ref: str, model) -> list[str]:
    """A name per image layer: the base's, the setup steps, one per model layer, then the final
    stage's (a step that writes nothing adds no layer)."""
    n, base_n = len(engine.layers(ref)), len(engine.layers(base_ref))
    named = ["base"] * base_n + ["etc-stubs", "prepare", "setup"] + [l.name for l in model.layers]
    return named + ["final"] * (n - len(named))


def _secret_files(values):
    from envbuild.secretfiles import secret_files

    return secret_files(values)


def push_section(engine, registry: str, ref: str | None, naive_ref: str | None, images: list[str],
                 second_ref: str | None = None) -> dict:
    """The floors first, in the same run: reading the image from the daemon (`docker save`, all
    bytes, nothing written) and reading it through `zstd -3 -T0` (every core). Then pushes to fresh
    repositories (no blob there yet): envbuild's image with each codec (none: the default to a
    loopback registry; zstd; gzip through docker push), the naive image with gzip, and the second
    combination after the first (only the layers it does not share are sent). Each push's ratio
    is to the floor of its codec (none and gzip: the read floor; zstd: the zstd floor); the load
    average is recorded beside each figure."""
    from envbuild.errors import InfraError

    out: dict = {"registry": registry, "floor": {}}
    if ref:
        for key, argv in (("read", None), ("zstd", ["zstd", "-3", "-T0", "-q", "-c"])):
            t = time.monotonic()
            n = _read_through(engine, ref, argv)
            out["floor"][key] = {"seconds": round(time.monotonic() - t, 1), "bytes": n, "load": _load()}
    run = hashlib.sha256(str(time.time()).encode()).hexdigest()[:8]
    todo = [("envbuild_none", ref, "none"), ("second_none", second_ref, "none"), ("envbuild_zstd", ref, "zstd"),
            ("envbuild_gzip", ref, "gzip"), ("naive_gzip", naive_ref, "gzip")]
    for key, src, comp in todo:
        if not src:
            continue
        # the second goes where the first went (envbuild_none): only what they do not share is sent
        repo = f"{run}-{'envbuild-none' if key.startswith('second') else key}".replace("_", "-")
        dst = f"{registry}/envbuild-bench/{repo}:{src.rsplit(':', 1)[1]}"
        engine.tag(src, dst)
        images.append(dst)
        load = _load()
        try:
            rep = engine.push_report(dst, compression=comp)
        except InfraError as e:
            out[key] = {"error": str(e)}
            continue
        floor = out["floor"].get("zstd" if comp == "zstd" else "read", {}).get("seconds")
        out[key] = {**rep.to_dict(), "digest": rep.digest, "pushed_bytes": _pushed_bytes(dst), "load": load,
                    "ratio_to_floor": round(rep.seconds / floor, 2) if floor else None}
    return out


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _read_through(engine, ref: str, argv) -> int:
    """Read the image out of the daemon (through `argv` when given); -> bytes at the end."""
    n = 0
    with engine.save_stream(ref) as stream:
        if argv is None:
            while chunk := stream.read(1 << 20):
                n += len(chunk)
            return n
        p = subprocess.Popen(argv, stdin=stream, stdout=subprocess.PIPE)
        while chunk := p.stdout.read(1 << 20):
            n += len(chunk)
        assert p.wait() == 0
    return n


def _pushed_bytes(ref: str) -> int | None:
    """Sum of the layer sizes in the pushed manifest (compressed bytes in the registry)."""
    import urllib.request

    from envbuild.push import MANIFEST_TYPES
    from envbuild.values import registry_host, split_ref

    repo, tag = split_ref(ref)
    host = registry_host(repo)
    req = urllib.request.Request(f"http://{host}/v2/{repo[len(host) + 1:]}/manifests/{tag}",
                                 headers={"Accept": MANIFEST_TYPES})
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=30) as r:
            man = json.load(r)
    except OSError:
        return None
    return sum(l.get("size", 0) for l in man.get("layers", []))


def print_table(out: dict, a, b) -> None:
    gb = 1e9
    rows = []
    if "naive" in out:
        n, e, s2, noop = out["naive"], out["envbuild"], out["second"], out["noop_seconds"]
        rows += [
            ("naive cold build (one RUN pip install)", f"{n['seconds']:.0f} s", f"{n['size'] / gb:.2f} GB", ""),
            ("envbuild cold build", f"{e['seconds']:.0f} s", f"{e['size'] / gb:.2f} GB",
             f"{out['ratios']['cold']:.2f}x naive (goal <= {GOALS['cold_ratio']})"),
            (f"second combination ({b.engine_label or b.engine})", f"{s2['seconds']:.0f} s",
             f"{s2['size'] / gb:.2f} GB", f"{out['ratios']['second']:.3f}x cold (goal <= {GOALS['second_ratio']})"),
            ("bytes shared with the second: envbuild", "", f"{out['shared_bytes']['envbuild'] / gb:.2f} GB", ""),
            ("bytes shared with the second: naive", "", f"{out['shared_bytes']['naive'] / gb:.2f} GB", "(base only)"),
            ("no-op rebuild, per combination", " / ".join(f"{x:.1f} s" for x in noop), "",
             f"goal <= {GOALS['noop_per_combo_s']} s"),
        ]
    push = out.get("push", {})
    for key, label in (("read", "floor: read the image (docker save)"), ("zstd", "floor: read + zstd -3 -T0")):
        r = push.get("floor", {}).get(key)
        if r:
            rows.append((label, f"{r['seconds']:.0f} s", f"{r['bytes'] / gb:.2f} GB", f"load {r['load']}"))
    for key, label in (("envbuild_none", "push envbuild image, none"), ("second_none", "push second image, none"),
                       ("envbuild_zstd", "push envbuild image, zstd"), ("envbuild_gzip", "push envbuild image, gzip"),
                       ("naive_gzip", "push naive image, gzip")):
        r = push.get(key)
        if r and "error" in r:
            rows.append((label, "-", "-", r["error"]))
        elif r:
            rows.append((label, f"{r['seconds']:.0f} s", f"{(r['pushed_bytes'] or 0) / gb:.2f} GB",
                         f"via {r['tool']}, {r['ratio_to_floor']}x floor, load {r['load']}, blobs {r['blobs']}"))
    tp = out.get("torch_pair")
    if tp:
        for bld in tp["builds"]:
            rows.append((f"torch-pair build {bld['combo']}", f"{bld['seconds']:.0f} s", f"{bld['size'] / gb:.2f} GB", ""))
        rows.append((f"torch {' vs '.join(tp['torch'])}: equal-digest layers", "",
                     f"{tp['shared_bytes'] / gb:.2f} GB",
                     f"CUDA libraries {tp['shared_cuda_bytes'] / gb:.2f} GB; "
                     + ", ".join(x["name"] for x in tp["shared"] if x["name"] != "base")))
    w = max(len(r[0]) for r in rows) if rows else 0
    print(f"{'':<{w}}  {'time':>12}  {'size':>9}  note")
    for r in rows:
        print(f"{r[0]:<{w}}  {r[1]:>12}  {r[2]:>9}  {r[3]}")


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
