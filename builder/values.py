"""The values every stage and reader passes around: a combination, the matrix's entry for an
accelerator variant, the base an image starts FROM, and the names of images (tags, content tags,
references). Nothing here reads a file, runs a process or talks to a registry: whoever needs a
combination or a base imports this, not the YAML parser or the container engine.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from .probe.hardware import DEFAULT_PLATFORM, platform_arch

# A docker image reference: registry/path:tag@digest, nothing a shell would interpret.
IMAGE_RE = re.compile(r"[a-z0-9][a-z0-9._/:-]{0,253}[a-z0-9](?::\w[\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?\Z",
                      re.ASCII)


# --------------------------------------------------------------------------- combinations


@dataclass(frozen=True)
class VariantEntry:
    """The matrix's entry for one accelerator variant (`cuda: {cu124: {...}}`)."""

    name: str  # the variant tag: cu124 (hardware.Variant.tag)
    toolkit: str  # 12.4
    base: str  # the toolkit's devel image for --base nvidia
    glibc: str  # glibc of that base: decides the wheel platform the locks target
    torch: str  # PEP 440 specifier: torch releases built for this variant


@dataclass(frozen=True, order=True)
class Combo:
    verl: str
    engine: str  # a vocab.ENGINES name
    engine_version: str  # "" for an unversioned engine (hf: transformers comes with verl)
    torch: str
    cuda: str  # the accelerator variant's tag (cu124; hardware.Variant); the field keeps the records' name
    python: str
    cuda_toolkit: str = field(default="", compare=False)
    base_image: str = field(default="", compare=False)
    glibc: str = field(default="", compare=False)
    note: str = field(default="", compare=False)  # e.g. planned although a matrix rule excludes it
    platform: str = DEFAULT_PLATFORM  # linux/amd64 | linux/arm64 (hardware.PLATFORMS)

    @property
    def engine_label(self) -> str:
        return f"{self.engine}{self.engine_version}"

    @property
    def tag(self) -> str:
        """The readable image tag; the one place its format is defined."""
        return combo_tag(self.verl, self.engine, self.engine_version, self.torch, self.cuda, self.python)

    @property
    def id(self) -> str:
        """One image's name: the tag, plus the platform for all but the default one (so ids made
        before the platform axis, and the records and tables that hold them, keep meaning the same)."""
        return combo_id(self.tag, self.platform)

    def hashed_tag(self, content_hash: str) -> str:
        return content_tag(self.id, content_hash)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["id"] = self.id
        d["tag"] = self.tag
        return d


def combo_tag(verl: str, engine: str, engine_version: str, torch: str, cuda: str, python: str) -> str:
    return f"verl{verl}-{engine}{engine_version}-torch{torch}-{cuda}-py{python}"


def combo_id(tag: str, platform: str | None) -> str:
    platform = platform or DEFAULT_PLATFORM
    return tag if platform == DEFAULT_PLATFORM else f"{tag}-{platform_arch(platform)}"


def content_tag(tag: str, content_hash: str) -> str:
    """The tag that names one rendering of a combination: its readable tag + the content hash."""
    return f"{tag}-{content_hash[:12]}"


# --------------------------------------------------------------------------- bases


@dataclass(frozen=True)
class Base:
    """The image a build starts FROM: the one type every command uses (envbuild.base makes them)."""

    kind: str  # "nvidia" | "bootstrap" | "image"
    ref: str
    digest: str | None = None  # sha256:... of the ref in its registry, when it was pulled from one

    @property
    def pinned(self) -> str:
        """The FROM reference: by digest when known, so a moved tag cannot change the build."""
        if self.digest and "@" not in self.ref:
            return f"{self.ref}@{self.digest}"
        return self.ref

    def to_dict(self) -> dict:
        d = {"kind": self.kind, "ref": self.ref}
        if self.digest:
            d["digest"] = self.digest
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Base":
        return cls(d["kind"], d["ref"], d.get("digest"))


# --------------------------------------------------------------------------- image names


def split_ref(ref: str) -> tuple[str, str]:
    """'host:5000/a/b:tag' -> ('host:5000/a/b', 'tag'); a digest ref keeps '@sha256:..'."""
    if "@" in ref:
        repo, dig = ref.split("@", 1)
        return repo, "@" + dig
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    if colon > slash:
        return ref[:colon], ref[colon + 1:]
    return ref, "latest"


def registry_host(repo: str) -> str | None:
    """The registry a repository names (`127.0.0.1:5000`), None for the default registry."""
    first = repo.split("/", 1)[0]
    if "/" in repo and ("." in first or ":" in first or first == "localhost"):
        return first
    return None


def sanitize_tag(tag: str) -> str:
    """A string -> a valid tag (`[A-Za-z0-9_.-]`, at most 128 characters)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", tag)[:128]


def image_refs(repo: str, combo_tag: str, content_hash: str) -> tuple[str, str]:
    """(content ref, readable ref) of a combination's image in repo."""
    return f"{repo}:{sanitize_tag(content_tag(combo_tag, content_hash))}", f"{repo}:{sanitize_tag(combo_tag)}"


_PINNED = re.compile(r"(?P<repo>[^@\s]+)@sha256:(?P<hex>[0-9a-f]{64})")


def parse_pinned(ref: object) -> tuple[str, str] | None:
    """'repo@sha256:hex' -> (repo, hex); anything else (a tag, None) -> None."""
    m = _PINNED.fullmatch(ref) if isinstance(ref, str) else None
    return (m["repo"], m["hex"]) if m else None
