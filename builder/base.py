"""Base images. `envbuild base bootstrap` makes a minimal Debian/Ubuntu base from the
distribution's own packages (debootstrap + `docker import`) for sites that mirror only a
package index and a distribution: Python comes from the distribution, the CUDA runtime later
from the torch/nvidia wheels.

The tag carries a hash of the inputs (suite, mirror, packages, recipe version), so a changed
input makes a new base and an unchanged one is reused. The build machine's CA bundle is never
copied in: ca-certificates comes from the distribution, and the proxy CA reaches builds only as
a BuildKit secret.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import EnvbuildError, InfraError, InputError
from .docker import split_ref
from .matrix import IMAGE_RE

# Bump when the recipe below changes in a way that changes the image.
RECIPE = 1
DEFAULT_SUITE = "bookworm"
DEFAULT_REPO = "envbuild/base"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
UBUNTU_SUITES = {"focal", "jammy", "noble", "oracular", "plucky"}
BASE_KINDS = ("nvidia", "bootstrap")  # anything else names an image


@dataclass(frozen=True)
class Base:
    """The image a build starts FROM: the one type every command uses."""
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


BaseRef = Base  # the older name, still imported by build.py and its tests


def registry_digest_of(engine, ref: str) -> str | None:
    """The digest a pulled image had in its registry (RepoDigests), None for a local-only one."""
    if engine is None:
        return None
    repo = split_ref(ref)[0]
    for rd in engine.repo_digests(ref):
        name, _, dig = rd.partition("@")
        if name == repo and dig.startswith("sha256:"):
            return dig
    return None


def host_mirror(suite: str, etc: Path = Path("/etc/apt")) -> str | None:
    """The mirror the host's apt already uses (so no mirror name lives in the project)."""
    want_ubuntu = suite in UBUNTU_SUITES
    cands: list[str] = []
    paths = [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*"))]
    for p in paths:
        if not p.is_file() or p.name.endswith((".disabled", ".save")) or "disabled" in p.name:
            continue
        try:
            text = p.read_text()
        except OSError:
            continue
        cands += re.findall(r"^\s*URIs:\s*(\S+)", text, re.M)
        cands += re.findall(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)", text, re.M)
    for uri in cands:
        if "security" in uri:
            continue
        if want_ubuntu == ("ubuntu" in uri):
            return uri
    return None


def inputs(suite: str, mirror: str, packages: tuple[str, ...] = PACKAGES) -> dict:
    return {"recipe": RECIPE, "suite": suite, "mirror": mirror, "variant": "minbase",
            "packages": sorted(packages), "arch": "amd64"}


def input_hash(inp: dict) -> str:
    return hashlib.sha256(json.dumps(inp, sort_keys=True).encode()).hexdigest()


def default_tag(suite: str, inp: dict) -> str:
    return f"{DEFAULT_REPO}:{suite}-py3-{input_hash(inp)[:12]}"


def default_bootstrap_ref(suite: str = DEFAULT_SUITE) -> str:
    """The tag `envbuild base bootstrap --suite SUITE` makes on this host (built or not)."""
    mirror = host_mirror(suite)
    if not mirror:
        raise InputError("/etc/apt/sources.list*", None, "mirror", None,
                         f"no apt mirror for suite {suite!r} on this host; pass --mirror URL")
    return default_tag(suite, inputs(suite, mirror))


def _sudo() -> list[str]:
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo"):
        return ["sudo", "-n"]
    raise InfraError("no-root", "debootstrap needs root (or passwordless sudo)")


def bootstrap(engine, suite: str = DEFAULT_SUITE, tag: str | None = None, mirror: str | None = None,
              log=print) -> Base:
    """Build (or reuse) the bootstrap base; returns its reference."""
    if not re.fullmatch(r"[a-z][a-z0-9-]*", suite):
        raise InputError("--suite", None, "suite", suite, "not a distribution suite name")
    mirror = mirror or host_mirror(suite)
    if not mirror:
        raise InputError("/etc/apt/sources.list*", None, "mirror", None,
                         f"no apt mirror for suite {suite!r} on this host; pass --mirror URL")
    inp = inputs(suite, mirror)
    ref = tag or default_tag(suite, inp)
    if engine.image_exists(ref):
        log(f"base {ref}: present, reused")
        return Base("bootstrap", ref)
    if not shutil.which("debootstrap"):
        raise InfraError("no-debootstrap", "debootstrap not installed (ci/services.sh installs it)")
    sudo = _sudo()
    work = Path(tempfile.mkdtemp(prefix="envbuild-base-", dir=os.environ.get("TMPDIR", "/var/tmp")))
    root = work / "rootfs"
    try:
        log(f"base {ref}: debootstrap {suite} from {mirror} (minbase + {' '.join(PACKAGES)})")
        cmd = [*sudo, "debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
               suite, str(root), mirror]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode != 0:
            tail = " | ".join(p.stdout.strip().splitlines()[-5:])
            raise InfraError("debootstrap-failed", f"{' '.join(cmd)} exited {p.returncode}: {tail}")
        _trim(root, sudo)
        # Tar the tree ourselves so ownership and modes survive exactly; docker import reads stdin.
        tar = subprocess.Popen([*sudo, "tar", "-C", str(root), "--numeric-owner", "-cf", "-", "."],
                               stdout=subprocess.PIPE)
        changes = ['ENV LANG=C.UTF-8', 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
                   'CMD ["/bin/bash"]', f'LABEL org.envbuild.base.suite={suite}',
                   f'LABEL org.envbuild.base.inputs={input_hash(inp)}']
        engine.import_tar(tar.stdout, ref, changes=changes)
        tar.stdout.close()
        if tar.wait() != 0:
            engine.remove(ref)
            raise InfraError("base-import", "tar of the bootstrapped tree failed")
        log(f"base {ref}: built")
        return Base("bootstrap", ref)
    finally:
        subprocess.run([*sudo, "rm", "-rf", str(work)], check=False)


def _trim(root: Path, sudo: list[str]) -> None:
    """Drop what a base does not need at run time: apt lists and caches, docs, the host's
    resolv.conf/hostname copies (docker supplies its own)."""
    junk = ["var/lib/apt/lists", "var/cache/apt", "usr/share/doc", "usr/share/man",
            "usr/share/info", "var/log"]
    for j in junk:
        subprocess.run([*sudo, "sh", "-c", f'rm -rf "{root / j}"/*'], check=False)
    for f in ("etc/resolv.conf", "etc/hostname"):
        subprocess.run([*sudo, "rm", "-f", str(root / f)], check=False)
    # A host-added CA (a proxy's) must never sit in the base; only the distribution's bundle.
    subprocess.run([*sudo, "sh", "-c", f'rm -rf "{root}/usr/local/share/ca-certificates"/*'], check=False)


def resolve_base(engine, spec: str, combo=None, suite: str = DEFAULT_SUITE, log=print,
                 bootstrap_ref: str | None = None) -> Base:
    """--base nvidia|bootstrap|IMAGE -> the base a build starts FROM; the one resolver.

    With an engine, bootstrap makes (or reuses) the base and a pulled image is pinned by its
    registry digest; without one (render, ci bake) nothing runs: bootstrap names the tag
    `envbuild base bootstrap` makes here, images stay unpinned."""
    if spec == "bootstrap":
        if engine is None:
            return Base("bootstrap", bootstrap_ref or default_bootstrap_ref(suite))
        return bootstrap(engine, suite=suite, tag=bootstrap_ref, log=log)
    if spec == "nvidia":
        ref = getattr(combo, "base_image", None) if combo is not None else None
        if not ref:
            raise InputError("--base", None, "base", spec, "combination has no base_image in the matrix")
        return Base("nvidia", ref, registry_digest_of(engine, ref))
    if not spec or not IMAGE_RE.match(spec):
        raise InputError("--base", None, "base", spec, "expected nvidia, bootstrap or an image reference")
    return Base("image", spec, registry_digest_of(engine, spec))


# --- CLI: envbuild base bootstrap -------------------------------------------------------------

def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="base_command", metavar="ACTION")
    b = sub.add_parser("bootstrap", help="debootstrap a minimal base with Python and import it")
    b.add_argument("--suite", default=DEFAULT_SUITE, help="distribution suite (default bookworm)")
    b.add_argument("--tag", help="image reference to create (default: envbuild/base:<suite>-py3-<input hash>)")
    b.add_argument("--mirror", help="distribution mirror (default: the one this host's apt uses)")


def run(args) -> int:
    if getattr(args, "base_command", None) != "bootstrap":
        raise EnvbuildError("expected an action: bootstrap (envbuild base bootstrap --help)")
    from .docker import detect
    engine = detect()
    ref = bootstrap(engine, suite=args.suite, tag=args.tag, mirror=args.mirror)
    print(ref.ref)
    return 0
