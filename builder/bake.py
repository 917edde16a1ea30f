"""`envbuild ci bake`: docker-bake.json for the plan.

One target per combination, the shared layers (base+torch, +engine) as targets the
combinations build on (contexts = target:...), registry cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from .errors import EnvbuildError, InputError
from .fsutil import write_atomic
from .matrix import content_tag



def _instructions(text: str) -> list[str]:
    """Dockerfile instructions (continuations joined, comments and blank lines dropped)."""
    out, cur = [], []
    for line in text.splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        cur.append(line)
        if not line.rstrip().endswith("\\"):
            out.append("\n".join(cur))
            cur = []
    if cur:
        out.append("\n".join(cur))
    return out


def _copied(instr: list[str]) -> list[str]:
    srcs = []
    for i in instr:
        if i.startswith("COPY "):
            parts = i.split()
            srcs += [p for p in parts[1:-1] if not p.startswith("--")]
    return srcs


def _hash_ctx(ctx: Path, srcs: list[str]) -> str:
    h = hashlib.sha256()
    for s in srcs:
        p = ctx / s
        files = sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p]
        for f in files:
            h.update(str(f.relative_to(ctx)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def split_layers(dockerfile_text: str) -> list[tuple[str, list[str]]]:
    """[(stage name, instructions)]: 'torch' (FROM base .. the torch install), 'engine' (its
    install, when the combination has one), 'final' (the rest). Stage boundaries follow the
    lock files each RUN installs, the layers that combinations share."""
    ins = _instructions(dockerfile_text)
    cuts: list[tuple[str, int]] = []
    for name in ("torch", "engine"):
        for i, x in enumerate(ins):
            if x.startswith("COPY ") and f"locks/{name}.txt " in x + " ":
                j = next((k for k in range(i + 1, len(ins)) if ins[k].startswith("RUN ")), None)
                if j is not None:
                    cuts.append((name, j + 1))
                break
    stages, start = [], 0
    for name, end in cuts:
        stages.append((name, ins[start:end]))
        start = end
    stages.append(("final", ins[start:]))
    return stages


def _target_name(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", s)


def bake_file(rendered: list[dict], repo_default: str, cache_default: str) -> dict:
    """rendered: [{"combo": dict, "context": path (relative), "content_hash", "lock_hash", "base"}]."""
    from .build import LABEL, sanitize_tag

    targets: dict[str, dict] = {}
    group: list[str] = []
    for r in sorted(rendered, key=lambda r: r["combo"]["id"]):
        ctx = Path(r["context"])
        text = (ctx / "Dockerfile").read_text()
        stages = split_layers(text)
        secrets = ["id=index-url,env=ENVBUILD_INDEX_URL", "id=ca-bundle,env=ENVBUILD_CA_BUNDLE"]
        if 'torch-index="default"' not in text:
            # torch for a variant that is not its release's default comes from the PyTorch index
            # for that variant (envbuild.index.torch_source): one variable per variant, because
            # one bake file may hold several variants.
            secrets.append(f"id=torch-index-url,env=ENVBUILD_TORCH_INDEX_URL_{r['combo']['cuda']}")
        parent_target, parent_key = None, ""
        for name, ins in stages:
            srcs = _copied(ins)
            key = hashlib.sha256("\0".join([parent_key, *ins, _hash_ctx(ctx, srcs)]).encode()).hexdigest()
            if name == "final":
                tname = _target_name(r["combo"]["id"])
            else:
                tname = f"layer-{name}-{key[:16]}"
            if parent_target:
                ins = [f"FROM envbuild-{parent_target[0]}"] + ins[1:] if ins and ins[0].startswith("FROM ") \
                    else [f"FROM envbuild-{parent_target[0]}"] + ins
            t = {"context": str(ctx), "dockerfile-inline": "\n".join(ins) + "\n", "secret": list(secrets),
                 "cache-from": [f"type=registry,ref=${{ENVBUILD_CACHE}}:{tname}"],
                 "cache-to": [f"type=registry,ref=${{ENVBUILD_CACHE}}:{tname},mode=max"]}
            if parent_target:
                t["contexts"] = {f"envbuild-{parent_target[0]}": f"target:{parent_target[1]}"}
            if name == "final":
                c = r["combo"]
                content = sanitize_tag(content_tag(c["tag"], r["content_hash"]))
                t["tags"] = [f"${{ENVBUILD_REPO}}:{content}", f"${{ENVBUILD_REPO}}:{sanitize_tag(c['tag'])}"]
                t["labels"] = {f"{LABEL}.combo": c["id"], f"{LABEL}.content-hash": r["content_hash"],
                               f"{LABEL}.lock-hash": r.get("lock_hash") or "",
                               f"{LABEL}.base": f"{r['base']['kind']}:{r['base']['ref']}"}
                group.append(tname)
                targets[tname] = t
            elif tname not in targets:  # shared: the first combination's context provides it
                targets[tname] = t
            parent_target, parent_key = (name, tname), key
    return {"variable": {"ENVBUILD_REPO": {"default": repo_default},
                         "ENVBUILD_CACHE": {"default": cache_default}},
            "group": {"default": {"targets": group}},
            "target": dict(sorted(targets.items()))}


def collect_rendered(combos, rendered_dir: Path, render_missing) -> list[dict]:
    out = []
    for c in combos:
        meta_path = rendered_dir / f"{c.id}.json"
        if not meta_path.is_file() or not (rendered_dir / c.id / "Dockerfile").is_file():
            render_missing(c)
        try:
            info = json.loads(meta_path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise InputError(str(meta_path), None, "rendered", str(meta_path), f"unreadable ({e})") from None
        ctx = rendered_dir / c.id
        rel = os.path.relpath(ctx)
        out.append({"combo": info["combo"], "context": rel if not rel.startswith("..") else str(ctx.resolve()),
                    "content_hash": info["content_hash"], "lock_hash": info.get("lock_hash"),
                    "base": info["base"]})
    return out


def run(args) -> int:
    from .index import Metadata
    from .matrix import matrix_from_args
    from .plan import plan_from_args

    meta = Metadata()
    m = matrix_from_args(args)
    pl = plan_from_args(args, meta)
    rendered_dir = Path(args.rendered)
    state: dict = {}

    def render_missing(c):
        from .lock import Locker
        from .render import base_for, render_combo

        if "locker" not in state:
            state["locker"] = Locker(m, meta)
        lock = state["locker"].lock(c, args.locks)
        if not lock.ok:
            raise EnvbuildError(f"{c.id}: cannot bake: lock {lock.status}: {' '.join(lock.detail.split())[:300]}")
        ref = None
        if args.base == "bootstrap":
            from .base import default_bootstrap_ref

            ref = default_bootstrap_ref()
        render_combo(c, lock, base_for(c, args.base, ref), rendered_dir)

    rendered = collect_rendered(pl.combos, rendered_dir, render_missing)
    repo = args.repo or m.image
    doc = bake_file(rendered, repo, args.cache or f"{repo}-buildcache")
    write_atomic(args.out, json.dumps(doc, indent=2) + "\n")
    shared = sum(1 for t in doc["target"] if t.startswith("layer-"))
    print(f"{args.out}: {len(doc['group']['default']['targets'])} combination target(s) on {shared} shared layer target(s)")
    return 0
