"""SLSA provenance v1 for an envbuild image: what it was built from and by what.

The build definition names the rendered Dockerfile and each lock file by sha256, the base
image by digest, and the probe code copied into the image; the run details name the builder
(envbuild's version, the Docker engine, the host) and the run that built it. Only facts
recorded at build time or re-hashed from the build context that produced the image (whose
content hash must equal the one in the record) go in.
"""

from __future__ import annotations

import hashlib

PREDICATE_TYPE = "https://slsa.dev/provenance/v1"  # cosign's --type slsaprovenance1
BUILD_TYPE = "https://envbuild.invalid/buildtypes/dockerfile@v1"  # documented in the README
BUILDER_ID = "https://envbuild.invalid/builder@v1"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def predicate(*, combo: dict, dockerfile: bytes, locks: dict[str, bytes], base: dict,
              probe_sha256: str | None, content_hash: str | None, lock_hash: str | None,
              builder: dict, run_id: str | None, started: str | None, finished: str | None) -> dict:
    """base: {"kind", "ref", "digest" ("sha256:…" or None), "digest_kind": "registry"|"image-id"}."""
    deps = []
    if base.get("digest"):
        deps.append({"name": "base", "uri": f"docker-image://{base['ref']}",
                     "digest": {"sha256": base["digest"].split(":", 1)[-1]},
                     "annotations": {"kind": base.get("kind"), "digest_kind": base.get("digest_kind")}})
    else:
        deps.append({"name": "base", "uri": f"docker-image://{base.get('ref')}",
                     "annotations": {"kind": base.get("kind"), "digest": "unknown"}})
    for name in sorted(locks):
        deps.append({"name": f"lock:{name}", "uri": f"locks/{name}", "digest": {"sha256": sha256(locks[name])}})
    if probe_sha256:
        deps.append({"name": "probe", "uri": "envbuild_probe/", "digest": {"sha256": probe_sha256}})
    byproducts = []
    if content_hash:
        byproducts.append({"name": "build-context", "digest": {"sha256": content_hash}})
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {
                "combination": combo,
                "dockerfile": {"path": "Dockerfile", "digest": {"sha256": sha256(dockerfile)}},
            },
            "internalParameters": {"lock_hash": lock_hash},
            "resolvedDependencies": deps,
        },
        "runDetails": {
            "builder": {"id": BUILDER_ID, "version": builder.get("version") or {},
                        "builderDependencies": builder.get("dependencies") or []},
            "metadata": {"invocationId": run_id, "startedOn": started, "finishedOn": finished},
            "byproducts": byproducts,
        },
    }


def summary(pred: dict) -> dict:
    bd, rd = pred.get("buildDefinition", {}), pred.get("runDetails", {})
    deps = {d.get("name"): d for d in bd.get("resolvedDependencies", []) if isinstance(d, dict)}
    base = deps.get("base", {})
    return {
        "dockerfile_sha256": bd.get("externalParameters", {}).get("dockerfile", {}).get("digest", {}).get("sha256"),
        "base": base.get("uri", "").removeprefix("docker-image://"),
        "base_digest": (base.get("digest") or {}).get("sha256"),
        "locks": {k.removeprefix("lock:"): v["digest"]["sha256"] for k, v in deps.items() if k and k.startswith("lock:")},
        "lock_hash": bd.get("internalParameters", {}).get("lock_hash"),
        "builder": rd.get("builder", {}).get("version"),
        "built": rd.get("metadata", {}).get("finishedOn") or rd.get("metadata", {}).get("startedOn"),
    }
