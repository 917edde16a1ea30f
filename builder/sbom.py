"""A CycloneDX 1.5 SBOM of an image from what installed it, not from a scan.

Two exact sources: the hash-pinned lock files the image's layers installed with
`--require-hashes` (in Dockerfile order, so a package pinned again in a later layer has that
layer's version, as in the venv), and the image's own dpkg database (/var/lib/dpkg/status),
which lists every Debian package of the base and any the Dockerfile added. Nothing is
guessed from files on disk. The same inputs give the same bytes (serial number derived from
the image digest, timestamp from the caller).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from .probe.vocab import ENGINE_SPECS

PREDICATE_TYPE = "https://cyclonedx.org/bom"  # cosign's --type cyclonedx
SPEC_VERSION = "1.5"
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


@dataclass(frozen=True)
class PyPackage:
    name: str
    version: str
    hashes: tuple[str, ...]
    layer: str
    env: str  # "venv" (the stack) or "tools" (uv, under its own prefix)


@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    arch: str
    source: str | None


def python_packages(layers: list[tuple[str, str]], tools: str | None = None) -> list[PyPackage]:
    """[(layer name, lock text)] in install order -> the packages the venv ends up with."""
    from .lockfile import parse_lock

    final: dict[str, PyPackage] = {}
    for layer, text in layers:
        for name, (version, block) in parse_lock(text).items():
            final[name] = PyPackage(name, version, tuple(_HASH.findall(block)), layer, "venv")
    out = sorted(final.values(), key=lambda p: p.name)
    if tools:
        out += [PyPackage(n, v, tuple(_HASH.findall(b)), "tools", "tools")
                for n, (v, b) in sorted(parse_lock(tools).items())]
    return out


def parse_dpkg_status(text: str) -> list[DebPackage]:
    """Installed packages of a dpkg status file (stanzas whose Status ends in 'installed')."""
    out = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") and key:
                continue  # continuation lines (descriptions, conffiles)
            if ":" in line:
                key, _, val = line.partition(":")
                fields[key.strip()] = val.strip()
        if fields.get("Package") and fields.get("Status", "").endswith(" installed"):
            src = fields.get("Source")
            out.append(DebPackage(fields["Package"], fields.get("Version", ""), fields.get("Architecture", ""),
                                  src.split(" ")[0] if src else None))
    return sorted(out, key=lambda p: (p.name, p.arch))


def parse_os_release(text: str) -> dict[str, str]:
    out = {}
    for line in (text or "").splitlines():
        if "=" in line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip().strip('"')
    return out


def cyclonedx(image_name: str, digest_hex: str, py: list[PyPackage], debs: list[DebPackage],
              os_release: dict[str, str], created: str, tool_version: str) -> dict:
    distro = os_release.get("ID", "debian")
    distro_q = f"&distro={distro}-{os_release['VERSION_ID']}" if os_release.get("VERSION_ID") else ""
    comps = []
    for p in py:
        c = {"type": "library", "name": p.name, "version": p.version, "purl": f"pkg:pypi/{p.name}@{p.version}",
             "properties": [{"name": "envbuild:layer", "value": p.layer},
                            {"name": "envbuild:environment", "value": "/opt/venv" if p.env == "venv" else "/opt/uv"}]}
        # A lock line allows one artifact per platform (often dozens of hashes); only when it allows
        # exactly one is that the installed file's hash. The lock files' own sha256s are in the
        # provenance statement, which pins the whole set.
        if len(p.hashes) == 1:
            c["hashes"] = [{"alg": "SHA-256", "content": p.hashes[0]}]
        comps.append(c)
    for d in debs:
        c = {"type": "library", "name": d.name, "version": d.version,
             "purl": f"pkg:deb/{distro}/{d.name}@{d.version}?arch={d.arch}{distro_q}"}
        if d.source and d.source != d.name:
            c["properties"] = [{"name": "dpkg:source", "value": d.source}]
        comps.append(c)
    return {
        "bomFormat": "CycloneDX", "specVersion": SPEC_VERSION, "version": 1,
        "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'{image_name}@sha256:{digest_hex}')}",
        "metadata": {
            "timestamp": created,
            "tools": {"components": [{"type": "application", "name": "envbuild", "version": tool_version}]},
            "component": {"type": "container", "bom-ref": f"{image_name}@sha256:{digest_hex}",
                          "name": image_name, "version": f"sha256:{digest_hex}",
                          "properties": [{"name": "envbuild:os", "value": os_release.get("PRETTY_NAME", distro)},
                                         {"name": "envbuild:sources", "value": "layer locks (pkg:pypi), "
                                          "/var/lib/dpkg/status (pkg:deb)"}]},
        },
        "components": comps,
    }


KEY_PACKAGES = ("torch", *(e.dist for e in ENGINE_SPECS), "verl", "flash-attn", "ray")  # what verify names


def summary(bom: dict, keys: tuple[str, ...] = KEY_PACKAGES) -> dict:
    """What `envbuild verify` prints: counts and the versions that matter."""
    py = [c for c in bom.get("components", []) if str(c.get("purl", "")).startswith("pkg:pypi/")
          and {"name": "envbuild:environment", "value": "/opt/venv"} in (c.get("properties") or [])]
    deb = [c for c in bom.get("components", []) if str(c.get("purl", "")).startswith("pkg:deb/")]
    versions = {c["name"]: c.get("version") for c in py if c.get("name") in keys}
    os_name = next((p.get("value") for p in (bom.get("metadata", {}).get("component", {}).get("properties") or [])
                    if p.get("name") == "envbuild:os"), None)
    return {"python_packages": len(py), "debian_packages": len(deb), "key_versions": versions, "os": os_name}
