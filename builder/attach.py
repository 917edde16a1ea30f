"""Signed statements attached to an image digest as OCI artifacts (`envbuild attach`), and
checked from the registry alone (`envbuild verify IMAGE@sha256:…`, `pick --verify-attestations`).

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

Verification trusts nothing the registry says: each envelope must carry a valid signature by
the pinned key, and the signed statement must name this image digest and the predicate type
the artifact claims. Unsigned, tampered, or for another digest is refused (exit 1); an
envelope signed only by another key is ignored (it is not ours to judge); a kind with no valid
statement is missing (exit 1).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from . import provenance, sbom
from .image import registry_host
from .errors import InfraError, InputError
from .sign import (IN_TOTO_PAYLOAD_TYPE, STATEMENT_TYPE, TEST_RESULT_PREDICATE, VerifyError,
                   load_public_key, load_signer, public_key_of, sign_statement, verify_envelope)

if TYPE_CHECKING:  # envbuild.registry (oras, requests, jsonschema: ~0.5 s) is imported where a
    # registry is asked: `envbuild --help` imports every command's module.
    from .registry import Descriptor, Registry

DSSE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
COSIGN_SIG_ANNOTATION = "dev.cosignproject.cosign/signature"
CREATED = "org.opencontainers.image.created"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@dataclass(frozen=True)
class Kind:
    name: str
    predicate_type: str
    artifact_type: str  # the referrers manifest's artifactType
    cosign_type: str  # `cosign verify-attestation --type`


KINDS = (
    Kind("test-result", TEST_RESULT_PREDICATE, "application/vnd.envbuild.test-result.v1+dsse", TEST_RESULT_PREDICATE),
    Kind("sbom", sbom.PREDICATE_TYPE, "application/vnd.envbuild.sbom.cyclonedx.v1+dsse", "cyclonedx"),
    Kind("provenance", provenance.PREDICATE_TYPE, "application/vnd.envbuild.provenance.slsa.v1+dsse",
         "slsaprovenance1"),
)
BY_PREDICATE = {k.predicate_type: k for k in KINDS}
_PINNED = re.compile(r"^(?P<repo>[^@\s]+)@(?P<digest>sha256:[0-9a-f]{64})$")


def parse_image_ref(ref: str) -> tuple[str, str, str]:
    """'host/name@sha256:…' -> (host, name, digest); anything else is an input error."""
    m = _PINNED.match(ref or "")
    host = registry_host(m["repo"]) if m else None
    if not m or not host:
        raise InputError("IMAGE", None, "image", ref, "expected REGISTRY/NAME@sha256:<64 hex> (a pushed image, by digest)")
    return host, m["repo"][len(host) + 1:], m["digest"]


def att_tag(digest: str) -> str:
    return digest.replace(":", "-") + ".att"


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
        envelopes.append((kind, _canon(sign_statement(st, signer))))
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


# ---------------------------------------------------------------- fetch


@dataclass
class Attached:
    source: str  # "referrers" or "tag"
    predicate_type: str | None  # what the artifact claims (annotation), not yet trusted
    raw: bytes
    created: str | None = None
    where: str = ""


def fetch(image_ref: str, registry: Registry | None = None) -> tuple[Descriptor | None, list[Attached]]:
    """(the image's descriptor or None if the registry lacks it, every DSSE envelope attached)."""
    from .registry import Registry

    host, name, digest = parse_image_ref(image_ref)
    reg = registry or Registry(host)
    subject = reg.head_manifest(name, digest)
    if subject is None:
        return None, []
    out: list[Attached] = []
    refs = reg.referrers(name, digest)
    for desc in refs or []:
        got = reg.get_manifest(name, desc.get("digest", ""))
        if not got:
            continue
        out += _envelopes_of(reg, name, got[1], "referrers", f"{name}@{got[0].digest}", want_subject=digest)
    got = reg.get_manifest(name, att_tag(digest))
    if got:
        out += _envelopes_of(reg, name, got[1], "tag", f"{name}:{att_tag(digest)}")
    return subject, out


def _envelopes_of(reg: Registry, name: str, body: bytes, source: str, where: str,
                  want_subject: str | None = None) -> list[Attached]:
    try:
        m = json.loads(body)
    except ValueError:
        return []
    if want_subject and (m.get("subject") or {}).get("digest") != want_subject:
        return []  # a referrers index listing a manifest about something else: not this image's
    created = (m.get("annotations") or {}).get(CREATED)
    out = []
    for layer in m.get("layers") or []:
        if not isinstance(layer, dict) or layer.get("mediaType") != DSSE_MEDIA_TYPE:
            continue
        raw = reg.get_blob(name, layer.get("digest", ""))
        if raw is None:
            continue
        out.append(Attached(source, (layer.get("annotations") or {}).get("predicateType"), raw, created,
                            f"{where} layer {layer.get('digest', '')[:19]}…"))
    return out


# ---------------------------------------------------------------- verify


@dataclass
class Checked:
    kind: Kind
    statement: dict
    source: str
    created: str | None


@dataclass
class Report:
    image: str
    keyid: str
    checked: dict[str, Checked]  # kind name -> the newest valid statement
    ignored: list[str]  # envelopes signed only by other keys
    sources: set[str]


def verify_image(image_ref: str, pubkey, registry: Registry | None = None) -> Report:
    """Fetch and check every attachment; raise VerifyError naming every problem."""
    key = load_public_key(pubkey)
    _, _, digest = parse_image_ref(image_ref)
    subject, found = fetch(image_ref, registry)
    if subject is None:
        raise VerifyError(f"{image_ref}: no such image in the registry")
    problems, ignored = [], []
    valid: dict[str, list[Checked]] = {}
    for a in found:
        kind = BY_PREDICATE.get(a.predicate_type or "")
        try:
            env = json.loads(a.raw)
        except ValueError:
            if kind:
                problems.append(f"{a.where}: not a DSSE envelope (not JSON)")
            continue
        sigs = env.get("signatures") if isinstance(env, dict) else None
        keyids = {s.get("keyid") for s in sigs or [] if isinstance(s, dict)}
        if isinstance(sigs, list) and sigs and key.keyid not in keyids:
            ignored.append(f"{a.where} ({a.predicate_type}): signed by another key")
            continue
        try:
            payload, ptype = verify_envelope(env, key, a.where)
        except VerifyError as e:
            if kind:
                problems.append(str(e))
            continue
        try:
            st = json.loads(payload)
        except ValueError:
            problems.append(f"{a.where}: signed payload is not JSON")
            continue
        subj = [s.get("digest", {}).get("sha256") for s in st.get("subject", []) if isinstance(s, dict)]
        if ptype != IN_TOTO_PAYLOAD_TYPE or st.get("_type") != STATEMENT_TYPE:
            problems.append(f"{a.where}: not an in-toto Statement v1")
            continue
        if digest.split(":", 1)[1] not in subj:
            problems.append(f"{a.where}: signed statement is for another image "
                            f"(sha256:{(subj[0] or '?')[:12] if subj else '?'}…, not {digest[:19]}…): moved attachment")
            continue
        signed_kind = BY_PREDICATE.get(st.get("predicateType"))
        if a.predicate_type != st.get("predicateType"):
            problems.append(f"{a.where}: labelled {a.predicate_type!r} but the signed statement is "
                            f"{st.get('predicateType')!r}")
            continue
        if signed_kind:
            valid.setdefault(signed_kind.name, []).append(Checked(signed_kind, st, a.source, a.created))
    for k in KINDS:
        if k.name not in valid:
            problems.append(f"{image_ref}: no valid {k.name} attestation signed by key {key.keyid[:16]}… "
                            f"({len(found)} attachment(s) found)")
    if problems:
        raise VerifyError("; ".join(problems))
    checked = {n: max(v, key=lambda c: c.created or "") for n, v in valid.items()}
    return Report(image_ref, key.keyid, checked, ignored, {a.source for a in found})


def describe(rep: Report) -> list[str]:
    """What a user reads: what was tested, at which level, when; what is inside; how built."""
    t = rep.checked["test-result"].statement["predicate"]
    e = t.get("envbuild") or {}
    levels = e.get("levels") or {}
    order = ("env", "contract", "gpu")
    lv = ", ".join(f"{n} {v.get('status')}" + (f" ({v.get('created')})" if v.get("created") else "")
                   for n, v in sorted(levels.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 9))
    cfg = {c.get("name"): c for c in t.get("configuration") or [] if isinstance(c, dict)}
    combo = (cfg.get("envbuild-combination") or {}).get("annotations") or {}
    where = " + ".join(sorted({"OCI referrers" if s == "referrers" else "tag sha256-….att" for s in rep.sources}))
    lines = [f"OK: {rep.image}",
             f"  signed by keyid {rep.keyid[:16]}… ({len(rep.checked)} attestations, via {where})",
             f"  combination: {combo.get('id', '?')}",
             f"  tested:  {t.get('result')}; best level {e.get('best_level') or 'none'} ({e.get('status')}); {lv}"]
    if e.get("timings"):
        stages = ("lock", "render", "build", "push", "probe")
        tm = sorted(e["timings"].items(), key=lambda kv: stages.index(kv[0]) if kv[0] in stages else 9)
        lines.append("           timings: " + ", ".join(f"{k} {v:.0f} s" if isinstance(v, (int, float)) else f"{k} {v}"
                                                     for k, v in tm))
    probe = (cfg.get("envbuild-probe") or {}).get("digest", {}).get("sha256")
    if probe:
        lines.append(f"           probe code sha256:{probe[:16]}…")
    s = sbom.summary(rep.checked["sbom"].statement["predicate"])
    keyv = ", ".join(f"{k} {v}" for k, v in sorted(s["key_versions"].items()))
    lines.append(f"  inside:  {s['python_packages']} Python packages ({keyv or 'none of the key ones'}), "
                 f"{s['debian_packages']} Debian packages ({s['os'] or 'os unknown'})")
    p = provenance.summary(rep.checked["provenance"].statement["predicate"])
    base_d = f"@sha256:{p['base_digest'][:12]}…" if p["base_digest"] else " (digest unknown)"
    lines.append(f"  built:   FROM {p['base']}{base_d}; Dockerfile sha256:{(p['dockerfile_sha256'] or '?')[:12]}…; "
                 f"lock sha256:{(p['lock_hash'] or '?')[:12]}…; {len(p['locks'])} lock files; "
                 f"by envbuild {(p['builder'] or {}).get('envbuild', '?')} at {p['built']}")
    for i in rep.ignored:
        lines.append(f"  note: ignored {i}")
    return lines


def verify_cli(image_ref: str, pubkey) -> int:
    """`envbuild verify IMAGE@sha256:…`: print the report; VerifyError (exit 1) otherwise."""
    pubkey = pubkey or os.environ.get("ENVBUILD_PUBKEY")
    if not pubkey:
        raise VerifyError("verifying an image needs a pinned key: pass --pubkey KEY (or set $ENVBUILD_PUBKEY)")
    for line in describe(verify_image(image_ref, pubkey)):
        print(line)
    return 0


def is_image_ref(arg: str) -> bool:
    return bool(arg) and _PINNED.match(arg) is not None and not Path(arg).exists()


# ---------------------------------------------------------------- statements from results


def _docker_client(engine) -> str:
    return engine.client if engine is not None else "docker"


def read_image_files(image: str, paths: list[str], engine=None) -> dict[str, bytes | None]:
    """Files out of an image without running it: `docker create` + `docker cp` (a tar stream)."""
    client = _docker_client(engine)
    p = subprocess.run([client, "create", image, "/envbuild-never-runs"], capture_output=True, text=True)
    if p.returncode != 0:
        raise InfraError("daemon-error", f"docker create {image}: {(p.stderr or p.stdout).strip()[-300:]}")
    cid = p.stdout.strip()
    out: dict[str, bytes | None] = {}
    try:
        for path in paths:
            cp = subprocess.run([client, "cp", "-L", f"{cid}:{path}", "-"], capture_output=True)
            if cp.returncode != 0:
                out[path] = None
                continue
            with tarfile.open(fileobj=io.BytesIO(cp.stdout)) as tf:
                member = next((m for m in tf.getmembers() if m.isfile()), None)
                out[path] = tf.extractfile(member).read() if member else None
    finally:
        subprocess.run([client, "rm", "-f", cid], capture_output=True)
    return out


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
    from .table import image_statement, parse_pinned

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
    local = next((ref for ref in (row["image"]["pinned"], (rec.image or {}).get("ref"), (rec.image or {}).get("id"))
                  if ref and _image_local(ref, engine)), None)
    if local is None:
        raise InfraError("daemon-error", f"{row['image']['pinned']}: not in the local engine; pull it to read its "
                                         "dpkg database for the SBOM")
    files = read_image_files(local, ["/var/lib/dpkg/status", "/etc/os-release"], engine)
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


def _image_local(ref: str, engine) -> bool:
    return subprocess.run([_docker_client(engine), "image", "inspect", ref], capture_output=True).returncode == 0


def _base_digest(ref: str | None, engine) -> dict:
    """A registry base: its repo digest; a local one (bootstrap): its image id (a config digest)."""
    if not ref:
        return {}
    p = subprocess.run([_docker_client(engine), "image", "inspect", "--format",
                        "{{json .RepoDigests}} {{.Id}}", ref], capture_output=True, text=True)
    if p.returncode != 0:
        return {"digest": None}
    repo_digests, _, iid = p.stdout.strip().partition(" ")
    rd = [d for d in json.loads(repo_digests or "[]") if "@" in d]
    if rd:
        return {"digest": rd[0].split("@", 1)[1], "digest_kind": "registry"}
    return {"digest": iid or None, "digest_kind": "image-id"}


# ---------------------------------------------------------------- CLI: envbuild attach


def add_arguments(p) -> None:
    p.add_argument("--results", default="results", help="results directory (default: results)")
    p.add_argument("--key", default=os.environ.get("ENVBUILD_SIGNING_KEY", os.path.join("keys", "envbuild.key")),
                   help="Ed25519 private key PEM (default: $ENVBUILD_SIGNING_KEY or keys/envbuild.key)")
    p.add_argument("--only", metavar="ID", action="append", help="only this combination id (repeatable)")
    p.add_argument("--cosign-pubkey", metavar="FILE",
                   help="also write the key's public half as PEM (SubjectPublicKeyInfo), the form "
                        "`cosign verify-attestation --key FILE` reads")


def attach_results(results: str | Path, signer, only: list[str] | None = None, engine=None):
    """Attach the statements of every pushed image in a results folder (the publish hook:
    `for _ in attach_results(results, signer): pass` after the table is written). Yields
    (combination id, AttachResult) as each image is done."""
    from .record import iter_records
    from .table import fold

    records = list(iter_records(results))
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
    for row_id, res in attach_results(args.results, signer, args.only):
        where = f"tag {res.tag}" + (" + OCI referrers" if res.referrers else "")
        print(f"{row_id}: attached {', '.join(res.kinds)} to {res.image} ({where}; {res.bytes_added} bytes)")
        n, total = n + 1, total + res.bytes_added
    print(f"{n} image(s), {total} bytes attached, signed by keyid {public_key_of(signer).keyid}",
          file=sys.stderr)
    return 0


# ---------------------------------------------------------------- pick --verify-attestations


def check_picked(row, pubkey=None, info: dict | None = None, quiet: bool = False) -> Report:
    """Before `pick` answers: the picked row's image's attestations, against the key that verified
    the table (or --pubkey / $ENVBUILD_PUBKEY). Raises VerifyError. `row`: a table row (dict or
    object with .pinned) or the image reference itself."""
    image_ref = row if isinstance(row, str) else getattr(row, "pinned", None) or \
        ((row.get("image") or {}).get("pinned") if isinstance(row, dict) else None)
    if not image_ref:
        raise VerifyError("the picked row has no pinned image: nothing to check")
    key = pubkey or os.environ.get("ENVBUILD_PUBKEY") or (info or {}).get("public_key")
    if key is None and (info or {}).get("envelope") and not str(info["envelope"]).startswith(("http:", "https:")):
        near = Path(info["envelope"]).parent / "pubkey.json"
        key = near if near.exists() else None
    if key is None:
        raise VerifyError("--verify-attestations needs the table's key: pass --pubkey KEY")
    rep = verify_image(image_ref, key)
    if not quiet:
        for line in describe(rep):
            print(line, file=sys.stderr)
    return rep
