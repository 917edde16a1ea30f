"""The write side of the attestations on an image digest (`envbuild attach`); envbuild.attest
checks them.

Three in-toto Statements per pushed image, each in a DSSE envelope signed with the table key
(the format cosign's `attest` writes: payloadType application/vnd.in-toto+json):
  test-result  the probe's verdict per level, when, timings, the probe code's sha256
  sbom         CycloneDX 1.5 from the hash-pinned locks and the image's dpkg database
  provenance   SLSA provenance v1: Dockerfile and lock sha256s, base digest, builder
Where they go, both written on every attach:
  - cosign's tag scheme: tag `sha256-<hex>.att` holds one layer per statement (media type
    application/vnd.dsse.envelope.v1+json, annotation `predicateType`). Works on any registry
    (the Debian one here has no referrers API) and is where `cosign verify-attestation` looks.
  - OCI 1.1 referrers, where the registry has the API: one manifest per statement whose
    `subject` is the image and whose `artifactType` names the statement kind.
A statement of ours re-attached replaces the older one in the tag; foreign layers (someone's
cosign attestation) are kept.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from . import provenance, recordsig, sbom
from .attest import (BY_PREDICATE, COSIGN_SIG_ANNOTATION, CREATED, DSSE_MEDIA_TYPE, EMPTY_MEDIA_TYPE, OCI_CONFIG,
                     OCI_MANIFEST, att_tag, parse_image_ref)
from .docker import Engine
from .errors import InfraError, InputError
from .sign import STATEMENT_TYPE, load_signer, public_key_of, sign_statement

if TYPE_CHECKING:  # envbuild.registry (oras, requests, jsonschema: ~0.5 s) is imported where a
    # registry is asked: `envbuild --help` imports every command's module.
    from .registry import Registry



def _now() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    t = time.gmtime(int(epoch)) if epoch and epoch.isdigit() else time.gmtime()
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", t)


def _canon(d: dict) -> bytes:
    return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()


# ---------------------------------------------------------------- attach


@dataclass
class AttachResult:
    image: str
    referrers: bool  # the registry has the referrers API (manifests with a subject were pushed)
    tag: str
    kinds: list[str]
    bytes_added: int  # envelope blobs + manifests + config written for this image
    manifests: list[str] = field(default_factory=list)


def stamped(st: dict) -> dict:
    """A test result carries when it was attested, inside what is signed (predicate.envbuild.
    attested: time and a serial, epoch milliseconds): readers pick the newest by it and refuse an
    older one than they saw, whatever the registry's unsigned annotations or layer order say."""
    from .sign import TEST_RESULT_PREDICATE
    if st.get("predicateType") != TEST_RESULT_PREDICATE:
        return st  # the SBOM and the provenance carry their own signed times
    st = json.loads(json.dumps(st))
    pred = st.setdefault("predicate", {})
    pred.setdefault("envbuild", {})["attested"] = {"at": _now(), "serial": time.time_ns() // 1_000_000}
    return st


def attach_all(image_ref: str, statements: list[dict], key, registry: Registry | None = None) -> AttachResult:
    """Sign each statement with `key` (path to the PEM, or a signer) and attach it to the image.

    The hook for build/publish: call it with `repo@sha256:…` right after the push, with the
    statements of statements_for() (or any in-toto Statements whose subject is that digest)."""
    from .registry import Registry, sha256_digest

    host, name, digest = parse_image_ref(image_ref)
    signer = load_signer(key) if isinstance(key, (str, Path)) else key
    envelopes = []
    for st in statements:
        subj = [s.get("digest", {}).get("sha256") for s in st.get("subject", [])]
        if st.get("_type") != STATEMENT_TYPE or f"sha256:{subj[0] if subj else ''}" != digest:
            raise InputError(image_ref, None, "statement.subject", subj, "statement does not name this image digest")
        kind = BY_PREDICATE.get(st.get("predicateType"))
        if kind is None:
            raise InputError(image_ref, None, "predicateType", st.get("predicateType"), "not an envbuild attachment kind")
        envelopes.append((kind, _canon(sign_statement(stamped(st), signer))))
    reg = registry or Registry(host)
    subject = reg.head_manifest(name, digest)
    if subject is None:
        raise InfraError("registry-error", f"{image_ref}: not in its registry (push it first)")
    created = _now()
    added = 0

    # The cosign tag: ours replace the same kinds, anything else stays.
    tag = att_tag(digest)
    keep_layers, old_config = [], None
    got = reg.get_manifest(name, tag)
    if got:
        try:
            old = json.loads(got[1])
            ours = {k.predicate_type for k, _ in envelopes}
            keep_layers = [l for l in old.get("layers", [])
                           if (l.get("annotations") or {}).get("predicateType") not in ours]
            old_config = old.get("config")
        except ValueError:
            keep_layers = []
    layers = list(keep_layers)
    for kind, env in envelopes:
        d = reg.put_blob(name, env, DSSE_MEDIA_TYPE)
        added += d.size
        layers.append({**d.to_dict(), "annotations": {"predicateType": kind.predicate_type,
                                                      COSIGN_SIG_ANNOTATION: ""}})
    # A config like cosign's: the layers as an image's rootfs (its diff_ids are the blob digests).
    config = _canon({"architecture": "", "os": "", "config": {}, "created": created,
                     "rootfs": {"type": "layers", "diff_ids": [l["digest"] for l in layers]}})
    cfg = reg.put_blob(name, config, OCI_CONFIG)
    added += cfg.size if (old_config or {}).get("digest") != cfg.digest else 0
    manifest = _canon({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": cfg.to_dict(), "layers": layers,
                       "annotations": {CREATED: created}})
    reg.put_manifest(name, tag, manifest)
    added += len(manifest)
    mdigests = []

    # OCI 1.1 referrers, where the registry serves them.
    before = reg.referrers(name, digest)
    has_referrers = before is not None
    if has_referrers:
        empty = reg.put_blob(name, b"{}", EMPTY_MEDIA_TYPE)
        added += empty.size
        for kind, env in envelopes:
            m = _canon({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": kind.artifact_type,
                        "config": empty.to_dict(),
                        "layers": [{"mediaType": DSSE_MEDIA_TYPE, "digest": sha256_digest(env), "size": len(env),
                                    "annotations": {"predicateType": kind.predicate_type}}],
                        "subject": subject.to_dict(),
                        "annotations": {CREATED: created, "predicateType": kind.predicate_type}})
            md = sha256_digest(m)
            reg.put_manifest(name, md, m)
            mdigests.append(md)
            added += len(m)
        # Our earlier statements of the same kinds are superseded: remove them where the registry
        # allows deletes (verify would otherwise still read, and rely on, the newest by date).
        ours = {k.artifact_type for k, _ in envelopes}
        for desc in before or []:
            if desc.get("artifactType") in ours and desc.get("digest") not in mdigests:
                try:
                    reg.delete_manifest(name, desc["digest"])
                except InfraError:
                    pass  # a registry that refuses deletes keeps them; verify reads the newest
    return AttachResult(image_ref, has_referrers, tag, [k.name for k, _ in envelopes], added, mdigests)


# ---------------------------------------------------------------- statements from results


def _layer_order(ctx: Path, locks: dict[str, bytes]) -> list[str]:
    """The image's layer locks in install order, from the model render_combo saved beside the
    build context; each layer's text must be the context's lock file (which the content hash
    covers), so the order is the only thing taken from outside the hashed context."""
    from .layers import ImageModel
    from .render import meta_path, read_meta

    saved = meta_path(ctx)
    try:
        layers = [(l.name, l.text) for l in ImageModel.from_dict(read_meta(ctx)["model"]).layers]
    except (InputError, KeyError, TypeError) as e:
        raise InputError(str(saved), None, "model.layers", None,
                         f"the rendered model beside the build context is missing or unreadable ({e}); re-render")
    for name, text in layers:
        if locks.get(name, b"").decode(errors="replace") != text:
            raise InputError(str(saved), None, "model.layers", name,
                             f"differs from the build context's locks/{name}.txt; re-render")
    return [name for name, _ in layers]


def statements_for(row: dict, records: list, results: str | Path, engine=None) -> list[dict]:
    """The three statements of a table row's pushed image, from its records, its build context
    (results/contexts/<id>/, which must hash to the record's content hash) and the image's
    own dpkg database."""
    from . import __version__
    from .render import PROBE_DIR, context_hash
    from .sign import statement
    from .row import parse_pinned
    from .table import image_statement

    table_row, row = row, (row.to_dict() if hasattr(row, "to_dict") else row)  # a Row object or its dict
    pinned = parse_pinned((row.get("image") or {}).get("pinned"))
    if not pinned:
        raise InputError(row.get("id", "?"), None, "image.pinned", None, "not pushed: nothing to attach to")
    repo, hexd = pinned
    mine = [r for r in records if (r.image or {}).get("digest") == row["image"]["pinned"]]
    ids = {(r.image or {}).get("id") for r in mine} - {None}
    mine += [r for r in records if r not in mine and (r.image or {}).get("id") in ids]
    mine.sort(key=lambda r: r.run_id)
    if not mine:
        raise InputError(row["id"], None, "records", row["image"]["pinned"], "no record names this image")
    rec = mine[-1]
    chash = next((r.image.get("content_hash") for r in reversed(mine) if r.image.get("content_hash")), None)
    ctx = Path(results) / "contexts" / row["id"]
    if not ctx.is_dir() or (chash and context_hash(ctx) != chash):
        raise InputError(str(ctx), None, "content_hash", chash,
                         "the build context is missing or was re-rendered since this image was built; "
                         "provenance must be exact, so rebuild (or re-render the same lock) first")
    dockerfile = (ctx / "Dockerfile").read_bytes()
    locks = {p.stem: p.read_bytes() for p in sorted((ctx / "locks").glob("*.txt"))}
    probe_sha = context_hash(ctx / PROBE_DIR) if (ctx / PROBE_DIR).is_dir() else None
    timings: dict = {}
    for r in mine:
        timings.update(r.timings or {})

    # 1. test-result: the table's statement plus when, how long and which probe judged.
    tr = image_statement(table_row)
    tr["predicate"]["envbuild"]["timings"] = timings
    tr["predicate"]["envbuild"]["run_ids"] = [r.run_id for r in mine]
    if probe_sha:
        tr["predicate"]["configuration"].append({"name": "envbuild-probe", "digest": {"sha256": probe_sha}})

    # 2. sbom from the locks (Dockerfile order) and the image's dpkg database.
    engine = engine or Engine.for_containers()
    local = next((ref for ref in (row["image"]["pinned"], (rec.image or {}).get("ref"), (rec.image or {}).get("id"))
                  if ref and engine.image_exists(ref)), None)
    if local is None:
        raise InfraError("daemon-error", f"{row['image']['pinned']}: not in the local engine; pull it to read its "
                                         "dpkg database for the SBOM")
    files = engine.read_files(local, ["/var/lib/dpkg/status", "/etc/os-release"])
    order = _layer_order(ctx, locks)
    py = sbom.python_packages([(n, locks[n].decode()) for n in order if n in locks],
                              locks["tools"].decode() if "tools" in locks else None)
    debs = sbom.parse_dpkg_status((files["/var/lib/dpkg/status"] or b"").decode(errors="replace"))
    osr = sbom.parse_os_release((files["/etc/os-release"] or b"").decode(errors="replace"))
    bom = sbom.cyclonedx(repo, hexd, py, debs, osr, rec.created, __version__)

    # 3. provenance.
    base = dict(rec.base or {})
    base.update(_base_digest(base.get("ref"), engine))
    pred = provenance.predicate(
        combo={"id": row["id"], **row["combo"]}, dockerfile=dockerfile, locks=locks, base=base,
        probe_sha256=probe_sha, content_hash=chash, lock_hash=rec.lock_hash or row.get("lock_hash"),
        builder={"version": {"envbuild": __version__},
                 "dependencies": [{"name": "docker", "annotations": {"machine": (rec.machine or {}).get("docker") or "",
                                                                       "host": (rec.machine or {}).get("hostname") or ""}}]},
        run_id=rec.run_id, started=mine[0].created, finished=rec.created)
    return [tr, statement(repo, hexd, sbom.PREDICATE_TYPE, bom), statement(repo, hexd, provenance.PREDICATE_TYPE, pred)]


def _base_digest(ref: str | None, engine: Engine) -> dict:
    """A registry base: its repo digest; a local one (bootstrap): its image id (a config digest)."""
    if not ref:
        return {}
    info = engine.inspect(ref)
    if info is None:
        return {"digest": None}
    rd = [d for d in info.get("RepoDigests") or [] if "@" in d]
    if rd:
        return {"digest": rd[0].split("@", 1)[1], "digest_kind": "registry"}
    return {"digest": info.get("Id") or None, "digest_kind": "image-id"}


# ---------------------------------------------------------------- CLI: envbuild attach


def add_arguments(p) -> None:
    p.add_argument("--results", default="results", help="results directory (default: results)")
    p.add_argument("--key", default=os.environ.get("ENVBUILD_SIGNING_KEY", os.path.join("keys", "envbuild.key")),
                   help="Ed25519 private key PEM (default: $ENVBUILD_SIGNING_KEY or keys/envbuild.key)")
    p.add_argument("--only", metavar="ID", action="append", help="only this combination id (repeatable)")
    p.add_argument("--cosign-pubkey", metavar="FILE",
                   help="also write the key's public half as PEM (SubjectPublicKeyInfo), the form "
                        "`cosign verify-attestation --key FILE` reads")
    p.add_argument("--json", action="store_true", help="one JSON object per image attached")
    recordsig.add_arguments(p)  # the nightly's: an unsigned record must not get a signed attestation either


def attach_results(results: str | Path, signer, only: list[str] | None = None, engine=None,
                   records_only: set[str] | None = None):
    """Attach the statements of every pushed image in a results folder (the publish hook:
    `for _ in attach_results(results, signer): pass` after the table is written). Yields
    (combination id, AttachResult) as each image is done. `records_only`: the record files to
    fold (the signed ones, recordsig), None for all."""
    from .record import iter_records
    from .fold import fold

    records = list(iter_records(results, records_only))
    by_combo: dict[str, list] = {}
    for r in records:
        by_combo.setdefault((r.combo or {}).get("id"), []).append(r)
    for table_row in fold(records):
        row = table_row.to_dict() if hasattr(table_row, "to_dict") else table_row
        if (only and row["id"] not in only) or not (row.get("image") or {}).get("pinned"):
            continue
        stmts = statements_for(table_row, by_combo[row["id"]], results, engine)
        yield row["id"], attach_all(row["image"]["pinned"], stmts, signer)


def run(args) -> int:
    if not Path(args.results).is_dir():
        raise InputError(args.results, None, "--results", args.results, "no such directory")
    signer = load_signer(args.key)
    if args.cosign_pubkey:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        from .fsutil import write_atomic

        raw = bytes.fromhex(public_key_of(signer).public_hex)
        write_atomic(args.cosign_pubkey, Ed25519PublicKey.from_public_bytes(raw).public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    n, total = 0, 0
    records_only, refused = recordsig.from_arguments(args, signer)
    for why in refused:
        print(f"envbuild attach: not attached: {why}", file=sys.stderr)
    for row_id, res in attach_results(args.results, signer, args.only, records_only=records_only):
        where = f"tag {res.tag}" + (" + OCI referrers" if res.referrers else "")
        if args.json:
            print(json.dumps({"id": row_id, "image": res.image, "kinds": list(res.kinds), "tag": res.tag,
                              "referrers": bool(res.referrers), "bytes_added": res.bytes_added}), flush=True)
        else:
            print(f"{row_id}: attached {', '.join(res.kinds)} to {res.image} ({where}; {res.bytes_added} bytes)")
        n, total = n + 1, total + res.bytes_added
    print(f"{n} image(s), {total} bytes attached, signed by keyid {public_key_of(signer).keyid}",
          file=sys.stderr)
    return 0


