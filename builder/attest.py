"""The check side of the attestations attached to an image digest (`envbuild verify
IMAGE@sha256:…`, `pick --verify-attestations`); envbuild.attach writes them.

Three in-toto Statements per pushed image, each in a DSSE envelope signed with the table key:
test-result, sbom (CycloneDX) and provenance (SLSA v1), found under cosign's tag
`sha256-<hex>.att` and, where the registry serves them, as OCI 1.1 referrers.

Verification trusts nothing the registry says: each envelope must carry a valid signature by
the pinned key, and the signed statement must name this image digest and the predicate type
the artifact claims. Unsigned, tampered, or for another digest is refused (a trust failure,
exit 2); an envelope signed only by another key is ignored (it is not ours to judge); a kind
with no valid statement is missing (exit 2). `pick --verify-attestations` also refuses an image
whose attested test result is not the table row's (query.attested_disagreement).
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import provenance, sbom
from .errors import InputError
from .query import attested_disagreement
from .sign import IN_TOTO_PAYLOAD_TYPE, STATEMENT_TYPE, TEST_RESULT_PREDICATE, VerifyError, load_public_key, verify_envelope
from .values import registry_host
from .probe.vocab import LEVELS

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
MAX_ENVELOPE_BYTES = 16 << 20  # a signed statement: an SBOM of a large image is a few MiB
MAX_ATTACHMENTS = 256  # layers of an .att manifest, or referrers of one image: ours are 3 per kind set
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
    if refs and len(refs) > MAX_ATTACHMENTS:
        raise VerifyError(f"{image_ref}: {len(refs)} referrers (more than {MAX_ATTACHMENTS}): refused")
    for desc in refs or []:
        ref = desc.get("digest")
        if not isinstance(ref, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", ref):
            continue  # not a descriptor we could ask for: nothing of ours
        got = reg.get_manifest(name, ref)
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
    except (ValueError, RecursionError):
        return []
    if not isinstance(m, dict):  # a JSON list or string where a manifest belongs: not ours
        return []
    subject = m.get("subject") if isinstance(m.get("subject"), dict) else {}
    if want_subject and subject.get("digest") != want_subject:
        return []  # a referrers index listing a manifest about something else: not this image's
    ann = m.get("annotations") if isinstance(m.get("annotations"), dict) else {}
    created = ann.get(CREATED) if isinstance(ann.get(CREATED), str) else None
    layers = m.get("layers") if isinstance(m.get("layers"), list) else []
    if len(layers) > MAX_ATTACHMENTS:
        raise VerifyError(f"{where}: {len(layers)} layers (more than {MAX_ATTACHMENTS}): refused")
    out = []
    for layer in layers:
        if not isinstance(layer, dict) or layer.get("mediaType") != DSSE_MEDIA_TYPE \
                or not isinstance(layer.get("digest"), str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", layer["digest"]):
            continue
        raw = reg.get_blob(name, layer["digest"], max_bytes=MAX_ENVELOPE_BYTES)
        if raw is None:
            continue
        la = layer.get("annotations") if isinstance(layer.get("annotations"), dict) else {}
        out.append(Attached(source, la.get("predicateType"), raw, created,
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


def signed_time(kind: str, st: dict) -> tuple:
    """The order of two valid statements of one kind, from what is signed: a test result's
    attested serial, the SBOM's metadata.timestamp, the provenance's runDetails.metadata times."""
    pred = st.get("predicate") if isinstance(st.get("predicate"), dict) else {}
    if kind == "test-result":
        att = ((pred.get("envbuild") or {}).get("attested") or {}) if isinstance(pred.get("envbuild"), dict) else {}
        serial = att.get("serial") if isinstance(att, dict) else None
        return (serial if isinstance(serial, int) and not isinstance(serial, bool) else -1,)
    if kind == "sbom":
        t = (pred.get("metadata") or {}).get("timestamp") if isinstance(pred.get("metadata"), dict) else None
        return (str(t or ""),)
    md = ((pred.get("runDetails") or {}).get("metadata") or {}) if isinstance(pred.get("runDetails"), dict) else {}
    return (str(md.get("finishedOn") or md.get("startedOn") or "") if isinstance(md, dict) else "",)


def attested_serial(rep: "Report") -> int | None:
    got = signed_time("test-result", rep.checked["test-result"].statement)[0]
    return got if got >= 0 else None


def verify_image(image_ref: str, pubkey, registry: Registry | None = None, allow_rollback: bool = False,
                 remember: bool = True) -> Report:
    """Fetch and check every attachment; raise VerifyError naming every problem. Of several valid
    statements of a kind the newest by its signed time counts; a test result older than one seen
    before for this digest (the state dir) is refused unless `allow_rollback`."""
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
    # The registry's `created` annotation and layer order are unsigned: anyone who can push could
    # put an old, validly signed PASSED first. Only the signed time orders them.
    checked = {n: max(v, key=lambda c: (signed_time(n, c.statement), c.created or "")) for n, v in valid.items()}
    rep = Report(image_ref, key.keyid, checked, ignored, {a.source for a in found})
    _fresh(rep, digest, allow_rollback, remember)
    return rep


def _fresh(rep: Report, digest: str, allow_rollback: bool, remember: bool) -> None:
    from .state import TrustStore
    serial = attested_serial(rep)
    if serial is None:
        return  # attached by an older envbuild: nothing signed to order by
    store = TrustStore.load()
    key = f"attested:{digest}"
    last = store.last_serial(key)
    if last is not None and serial < last and not allow_rollback:
        raise VerifyError(f"{rep.image}: the newest valid test result (attested serial {serial}) is older than "
                          f"one seen before for this image (serial {last}): a rollback, or a stale registry; "
                          "--allow-rollback reads it anyway (forensics)")
    if remember and (last is None or serial > last):
        store.saw(key, serial, rep.image)


def describe(rep: Report) -> list[str]:
    """What a user reads: what was tested, at which level, when; what is inside; how built."""
    t = rep.checked["test-result"].statement["predicate"]
    e = t.get("envbuild") or {}
    levels = e.get("levels") or {}
    lv = ", ".join(f"{n} {v.get('status')}" + (f" ({v.get('created')})" if v.get("created") else "")
                   for n, v in sorted(levels.items(), key=lambda kv: LEVELS.index(kv[0]) if kv[0] in LEVELS else 9))
    cfg = {c.get("name"): c for c in t.get("configuration") or [] if isinstance(c, dict)}
    combo = (cfg.get("envbuild-combination") or {}).get("annotations") or {}
    where = " + ".join(sorted({"OCI referrers" if s == "referrers" else "tag sha256-….att" for s in rep.sources}))
    lines = [f"OK: {rep.image}",
             f"  signed by keyid {rep.keyid[:16]}… ({len(rep.checked)} attestations, via {where})",
             f"  combination: {combo.get('id', '?')}",
             f"  tested:  {t.get('result')}; best level {e.get('best_level') or 'none'} ({e.get('status')}); {lv}"]
    if e.get("timings"):
        from .outcome import STAGES as stages
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


def verify_cli(image_ref: str, pubkey, allow_rollback: bool = False) -> int:
    """`envbuild verify IMAGE@sha256:…`: print the report; VerifyError (a trust failure) otherwise."""
    pubkey = pubkey or os.environ.get("ENVBUILD_PUBKEY")
    if not pubkey:
        raise VerifyError("verifying an image needs a pinned key: pass --pubkey KEY (or set $ENVBUILD_PUBKEY)")
    for line in describe(verify_image(image_ref, pubkey, allow_rollback=allow_rollback)):
        print(line)
    return 0


def is_image_ref(arg: str) -> bool:
    return bool(arg) and _PINNED.match(arg) is not None and not Path(arg).exists()


# ---------------------------------------------------------------- pick --verify-attestations



def check_picked(row, pubkey=None, info: dict | None = None, quiet: bool = False,
                 allow_rollback: bool = False) -> Report:
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
    rep = verify_image(image_ref, key, allow_rollback=allow_rollback)
    if not isinstance(row, (str, dict)):  # a table row: what the image attests must be what it says
        why = attested_disagreement(row, rep.checked["test-result"].statement.get("predicate") or {})
        if why:
            raise VerifyError(f"{image_ref}: {why}: the row and the image's own signed result disagree; refused")
    if not quiet:
        for line in describe(rep):
            print(line, file=sys.stderr)
    return rep
