"""`envbuild ci bake`: docker-bake.json for the plan.

One target per combination, the shared layers (base+torch, +engine) as targets the
combinations build on (contexts = target:...), registry cache. Every target's Dockerfile is
rendered from the combination's layer model (envbuild.layers, saved next to the rendered
context): the same template, one stage at a time; no Dockerfile is read back.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

from . import image
from .selector import add_selector_args
from .outcome import exit_of_lock
from .index_config import torch_index_env
from .probe.vocab import EXIT_INFRA
from .errors import EnvbuildError, InfraError, InputError
from .fsutil import write_atomic
from .index import Metadata
from .layers import ImageModel
from .lock import Locker
from .matrix import matrix_from_args
from .expand import plan_from_args
from .values import image_refs

from .render import (BUILD_CONSTRAINTS, PROBE_DIR, STEP_SCRIPTS, STUBS_TAR, base_for, meta_path, read_meta,
                     render_combo, render_stages)


def _hash_ctx(ctx: Path, srcs: list[str]) -> str:
    h = hashlib.sha256()
    for s in srcs:
        p = ctx / s
        files = sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p]
        for f in files:
            h.update(str(f.relative_to(ctx)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def stage_sources(model: ImageModel, stage: str) -> list[str]:
    """The context files a stage reads (COPY or bind mount), from the model."""
    srcs = [STUBS_TAR, "envbuild/secrets-env.sh", "locks/tools.txt"] if stage == "torch" else \
        ["envbuild/secrets-env.sh"]
    srcs += [f"envbuild/{n}" for n in STEP_SCRIPTS]  # every stage installs
    srcs += [l.lock_file for l in model.stage_layers(stage)]
    if any(model.constrains_builds(l) for l in model.stage_layers(stage)):
        srcs.append(BUILD_CONSTRAINTS)
    if stage == "final":
        srcs += ["envbuild/check-env.py", "locks", PROBE_DIR]
    return srcs


def split_layers(model: ImageModel) -> list[tuple[str, str]]:
    """[(stage, its Dockerfile text FROM its parent)]: 'torch' (the base .. torch), 'engine'
    (the engine and its kernels, when the combination has one), 'final' (verl, the check, the
    probe, the labels). Each stage ends with layers other combinations share."""
    out, parent = [], None
    for stage in model.stages():
        out.append((stage, render_stages(model, (stage,), from_ref=f"envbuild-{parent}" if parent else None,
                                         header=False)))
        parent = stage
    return out


def _target_name(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", s)


def bake_file(rendered: list[dict], repo_default: str, cache_default: str) -> dict:
    """rendered: [{"combo", "context" (relative path), "content_hash", "lock_hash", "base", "model"}]."""
    targets: dict[str, dict] = {}
    group: list[str] = []
    for r in sorted(rendered, key=lambda r: r["combo"]["id"]):
        ctx = Path(r["context"])
        model = ImageModel.from_dict(r["model"])
        secrets = ["id=index-url,env=ENVBUILD_INDEX_URL", "id=ca-bundle,env=ENVBUILD_CA_BUNDLE"]
        if model.needs_torch_index:
            secrets.append(f"id=torch-index-url,env={torch_index_env(model.combo.cuda)}")
        parent_target, parent_key = None, ""
        for name, text in split_layers(model):
            key = hashlib.sha256("\0".join([parent_key, text, _hash_ctx(ctx, stage_sources(model, name))])
                                 .encode()).hexdigest()
            tname = _target_name(model.combo.id) if name == "final" else f"layer-{name}-{key[:16]}"
            t = {"context": str(ctx), "dockerfile-inline": text, "secret": list(secrets),
                 "platforms": [model.combo.platform],
                 "cache-from": [f"type=registry,ref=${{ENVBUILD_CACHE}}:{tname}"],
                 "cache-to": [f"type=registry,ref=${{ENVBUILD_CACHE}}:{tname},mode=max"]}
            if parent_target:
                t["contexts"] = {f"envbuild-{parent_target[0]}": f"target:{parent_target[1]}"}
            if name == "final":
                content, readable = image_refs("${ENVBUILD_REPOSITORY}", model.combo.id, r["content_hash"])
                t["tags"] = [content, readable]
                # created is the build's time, not the bake file's: buildx sets it on the image config.
                t["labels"] = {k: v for k, v in image.build_labels(
                    model.combo.id, r["content_hash"], r.get("lock_hash"), model.base.kind, model.base.ref).items()
                    if k != f"{image.OCI}.created"}
                group.append(tname)
                targets[tname] = t
            elif tname not in targets:  # shared: the first combination's context provides it
                targets[tname] = t
            parent_target, parent_key = (name, tname), key
    return {"variable": {"ENVBUILD_REPOSITORY": {"default": repo_default},
                         "ENVBUILD_CACHE": {"default": cache_default}},
            "group": {"default": {"targets": group}},
            "target": dict(sorted(targets.items()))}


def collect_rendered(combos, rendered_dir: Path, render_missing) -> list[dict]:
    out = []
    for c in combos:
        ctx = rendered_dir / c.id
        info = read_meta(ctx) if (ctx / "Dockerfile").is_file() else None
        if info is None or "model" not in info:  # missing, or rendered by an envbuild without the model
            render_missing(c)
            info = read_meta(ctx)
        if info is None:
            raise InputError(str(meta_path(ctx)), None, "rendered", str(meta_path(ctx)), "missing after rendering")
        rel = os.path.relpath(ctx)
        out.append({"combo": info["combo"], "context": rel if not rel.startswith("..") else str(ctx.resolve()),
                    "content_hash": info["content_hash"], "lock_hash": info.get("lock_hash"),
                    "base": info["base"], "model": info["model"]})
    return out


def add_arguments(b) -> None:
    add_selector_args(b)
    b.add_argument("--out", default="docker-bake.json", help="output file (default: docker-bake.json)")
    b.add_argument("--rendered", default="rendered", help="rendered contexts (`envbuild render --out`); "
                                                      "missing ones are locked and rendered here")
    b.add_argument("--locks", default="locks", help="lock folder for missing renders (default: ./locks)")
    b.add_argument("--base", default="nvidia", help="base for missing renders: nvidia | bootstrap | IMAGE")
    image.add_repository_arg(b, "tag for")
    b.add_argument("--cache", help="registry cache repository (default: REPO-buildcache)")


def run(args) -> int:
    meta = Metadata()
    m = matrix_from_args(args)
    pl = plan_from_args(args, meta)
    rendered_dir = Path(args.rendered)
    state: dict = {}

    def render_missing(c):
        if "locker" not in state:
            state["locker"] = Locker(m, meta)
        lock = state["locker"].lock(c, args.locks)
        if not lock.ok:
            why = f"{c.id}: cannot bake: lock {lock.status}: {' '.join(lock.detail.split())[:300]}"
            if exit_of_lock(lock.status) == EXIT_INFRA:  # the index, not the stack
                raise InfraError(lock.status, why)
            raise EnvbuildError(why)
        render_combo(c, lock, base_for(c, args.base), rendered_dir)

    rendered = collect_rendered(pl.combos, rendered_dir, render_missing)
    repo, _ = image.repository_from_args(args, m.repository, lambda t: print(f"warning: {t}", file=sys.stderr))
    doc = bake_file(rendered, repo, args.cache or f"{repo}-buildcache")
    write_atomic(args.out, json.dumps(doc, indent=2) + "\n")
    shared = sum(1 for t in doc["target"] if t.startswith("layer-"))
    print(f"{args.out}: {len(doc['group']['default']['targets'])} combination target(s) on {shared} shared layer target(s)")
    return 0
