"""Multi-platform tags: one image index (manifest list) per readable tag, pointing at the
per-platform images envbuild pushed, so `docker pull REPO:TAG` gets the right one on either
platform.

Each (combination, platform) is built and pushed by its own tag; afterwards
group_for_indexes(records) says which readable tag gets which platform's digest, and
push_index(ref, children) writes the index under that tag. Before anything is written every
child is read back from the registry: it must be one platform's image (not an index) whose
config says the os/architecture it is filed under, so an amd64 image filed as arm64 is refused,
naming both, and the tag is left as it was.

The index's media type follows its children, and they must agree:
  * Docker schema 2 manifests (what `docker push` writes, gzip) -> a Docker manifest list
    (application/vnd.docker.distribution.manifest.list.v2+json), which may only name Docker
    manifests;
  * OCI manifests (envbuild's own pusher: none and zstd layers) -> an OCI image index.
A mix is refused rather than written as an OCI index: the OCI spec allows it, but registries
differ (strict ones such as Nexus reject a list whose type does not fit its children; Quay
failed on mixed indexes until mid-2026), and a tag that pushes to one registry and not another
is worse than one clear error: push every platform of a combination the same way (one
--compression).
The entries are sorted by platform and the JSON is canonical, so the same children always make
the same bytes, hence the same digest.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Iterable

from .errors import InfraError, InputError
from .values import image_refs, split_ref
from .record import Record
from .probe.hardware import DEFAULT_PLATFORM, parse_platform, platform_arch

if TYPE_CHECKING:  # envbuild.registry (oras, requests: ~0.35 s) is imported where a registry is
    # asked: build imports this module, and `envbuild --help` imports every command's module.
    from .registry import Registry

# The variant an index entry carries, as docker writes it (`docker buildx`, `docker manifest`):
# arm64 images are arm64/v8; amd64 has none. A child's config may omit it.
VARIANT = {"linux/arm64": "v8"}
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
MAX_CONFIG_BYTES = 16 << 20
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")


def _canon(d: dict) -> bytes:
    return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()


def entry_platform(platform: str) -> dict:
    """`linux/arm64` -> {"architecture": "arm64", "os": "linux", "variant": "v8"}."""
    return {"architecture": platform_arch(platform), "os": platform.split("/", 1)[0],
            **({"variant": VARIANT[platform]} if platform in VARIANT else {})}


def _parse_children(ref: str, children: dict[str, str]) -> dict[str, str]:
    """{any platform spelling: digest} -> {canonical platform: digest}, or InputError."""
    if not isinstance(children, dict) or not children:
        raise InputError(ref, None, "children", children, "expected {platform: sha256 digest}, at least one")
    out: dict[str, str] = {}
    for plat, digest in children.items():
        p = parse_platform(plat)
        if p is None:
            raise InputError(ref, None, "platform", plat, "not a platform envbuild builds (linux/amd64, linux/arm64)")
        if p in out:
            raise InputError(ref, None, "platform", plat, f"{p} is given twice")
        if not isinstance(digest, str) or not _DIGEST.match(digest):
            raise InputError(ref, None, f"children[{p}]", digest, "expected a manifest digest sha256:<64 hex>")
        out[p] = digest
    return out


def _split_index_ref(ref: str) -> tuple[str, str, str]:
    """'host:5000/a/b:tag' -> (host, 'a/b', tag); the tag must be given."""
    from .registry import split_repo  # lazy: see the TYPE_CHECKING note above

    repo, tag = split_ref(ref if isinstance(ref, str) else "")
    if not isinstance(ref, str) or tag.startswith("@") or not ref.endswith(":" + tag) or not _TAG.match(tag):
        raise InputError(ref, None, "ref", ref, "expected HOST[:PORT]/NAME:TAG (an index is written under a tag)")
    try:
        host, name = split_repo(repo)
    except ValueError as e:
        raise InputError(ref, None, "ref", ref, str(e)) from None
    return host, name, tag


def _child(reg: Registry, name: str, ref: str, platform: str, digest: str) -> dict:
    """The index entry for one child, after reading it back: one platform's image whose config
    says `platform`. InputError for a wrong child, InfraError when the registry fails us."""
    from .registry import DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST  # lazy: see above

    where = f"{reg.host}/{name}@{digest}"
    field = f"children[{platform}]"
    got = reg.get_manifest(name, digest)
    if got is None:
        raise InfraError("registry-error", f"{where}: not in {reg.host}/{name} (push it first)")
    desc, body = got
    try:
        m = json.loads(body)
    except ValueError:
        m = None
    if not isinstance(m, dict):
        raise InfraError("registry-error", f"{where}: the registry served a manifest that is not a JSON object")
    mt = m.get("mediaType") or desc.media_type
    if mt in (DOCKER_LIST, OCI_INDEX) or "manifests" in m:
        raise InputError(ref, None, field, digest, "is itself an index (a multi-platform list), not one "
                         "platform's image: give the per-platform manifest digests")
    if mt not in (DOCKER_MANIFEST, OCI_MANIFEST):
        raise InputError(ref, None, field, digest, f"has media type {mt or 'none'}: not a Docker schema 2 "
                         "or OCI image manifest")
    cfg = m.get("config") if isinstance(m.get("config"), dict) else {}
    if cfg.get("mediaType") not in (DOCKER_CONFIG, OCI_CONFIG) or not _DIGEST.match(str(cfg.get("digest"))):
        raise InputError(ref, None, field, digest, f"is not a container image (config media type "
                         f"{cfg.get('mediaType') or 'none'})")
    raw = reg.get_blob(name, cfg["digest"], max_bytes=MAX_CONFIG_BYTES)
    if raw is None:
        raise InfraError("registry-error", f"{where}: its config {cfg['digest']} is not in the registry")
    try:
        conf = json.loads(raw)
    except ValueError:
        conf = None
    if not isinstance(conf, dict):
        raise InputError(ref, None, field, digest, f"its config {cfg['digest']} is not a JSON object")
    os_, arch, variant = (str(conf.get(k) or "") for k in ("os", "architecture", "variant"))
    says = "/".join(x for x in (os_, arch, variant) if x) or "no platform"
    want = entry_platform(platform)
    if (os_, arch) != (want["os"], want["architecture"]) or variant not in ("", want.get("variant", "")):
        raise InputError(ref, None, field, digest, f"is an image for {says} (its config's os/architecture), "
                         f"filed under {platform}: refusing to write the index")
    return {"mediaType": mt, "digest": desc.digest, "size": desc.size, "platform": want}


def push_index(ref: str, children: dict[str, str], *, registry: Registry | None = None) -> str:
    """Write the index of `children` ({platform: digest of a manifest in the same repository})
    under ref's tag; return its digest as the registry reports it (= sha256 of the bytes sent).

    Nothing is written unless every child is an image for the platform it is filed under and
    all children are of one kind (Docker schema 2 or OCI)."""
    from .registry import DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, Registry, sha256_digest  # lazy: see above

    host, name, tag = _split_index_ref(ref)
    kids = _parse_children(ref, children)
    reg = registry or Registry(host)
    entries = [_child(reg, name, ref, p, kids[p]) for p in sorted(kids)]
    kinds = {e["mediaType"] for e in entries}
    if len(kinds) > 1:
        mixed = ", ".join(f"{p}: {'Docker schema 2' if e['mediaType'] == DOCKER_MANIFEST else 'OCI'}"
                          for p, e in zip(sorted(kids), entries))
        raise InputError(ref, None, "children", mixed, "mixes Docker schema 2 and OCI manifests, which some "
                         "registries refuse in one list: push every platform the same way (one --compression)")
    media_type = DOCKER_LIST if kinds == {DOCKER_MANIFEST} else OCI_INDEX
    body = _canon({"schemaVersion": 2, "mediaType": media_type, "manifests": entries})
    sent = sha256_digest(body)
    r = reg.put_manifest(name, tag, body, media_type)
    said = r.headers.get("Docker-Content-Digest")
    if not said:  # a registry may leave the header out: ask for the tag
        d = reg.head_manifest(name, tag)
        said = d.digest if d else None
    if said != sent:
        raise InfraError("registry-error", f"PUT {host}/{name}:{tag}: sent an index with digest {sent} but the "
                         f"registry reports {said or 'none'}")
    return said


# ---------------------------------------------------------------- which tag gets which children


def _get(rec, key: str):
    return getattr(rec, key, None) if isinstance(rec, Record) else (rec.get(key) if isinstance(rec, dict) else None)


def group_for_indexes(records: Iterable) -> dict[str, dict[str, str]]:
    """The latest records of a run (Record objects or their dicts) -> {readable ref:
    {platform: manifest digest}} for the images that were pushed (image.digest set). A tag
    appears only with at least one pushed child; two different digests for one tag and platform
    are an input error (records of two runs mixed)."""
    out: dict[str, dict[str, str]] = {}
    who: dict[tuple[str, str], str] = {}
    for rec in records:
        combo, img = _get(rec, "combo") or {}, _get(rec, "image") or {}
        pinned = img.get("digest") if isinstance(img, dict) else None
        if not pinned or not isinstance(combo, dict):
            continue
        cid = str(combo.get("id"))
        pushed_repo, _, digest = pinned.rpartition("@")
        repo = split_ref(img["ref"])[0] if img.get("ref") else pushed_repo
        if not _DIGEST.match(digest) or not repo or (pushed_repo and pushed_repo != repo):
            raise InputError(cid, None, "image.digest", pinned, f"expected {repo}@sha256:<64 hex>")
        plat = parse_platform(combo.get("platform") or DEFAULT_PLATFORM)
        if plat is None:
            raise InputError(cid, None, "combo.platform", combo.get("platform"), "not a platform")
        tag = combo.get("tag")
        if not isinstance(tag, str) or not tag:
            raise InputError(cid, None, "combo.tag", tag, "a pushed image's record names no tag")
        # Combo.tag carries no platform (Combo.id does): every platform of a combination has one
        # readable ref, the one the build tags (values.image_refs).
        readable = image_refs(repo, tag, img.get("content_hash") or "")[1]
        have = out.setdefault(readable, {})
        if have.get(plat, digest) != digest:
            raise InputError(cid, None, "image.digest", digest, f"{readable} on {plat} is already "
                             f"{have[plat]} (from {who[readable, plat]}): one record per combination and platform")
        have[plat] = digest
        who[readable, plat] = cid
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}
