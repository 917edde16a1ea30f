"""Base images. `envbuild base bootstrap` makes a minimal Debian/Ubuntu base from the
distribution's own packages (debootstrap + `docker import`) for sites that mirror only a
package index and a distribution: Python comes from the distribution, the CUDA runtime later
from the torch/nvidia wheels.

The tag carries a hash of the inputs (suite, mirror, packages, architecture, recipe version),
so a changed input makes a new base and an unchanged one is reused. The build machine's CA
bundle is never copied in: ca-certificates comes from the distribution, and the proxy CA reaches
builds only as a BuildKit secret.

Another platform (linux/arm64 on an amd64 host): `debootstrap --foreign` for its architecture,
the second stage in a chroot under qemu user emulation (ci/emulation.sh registers the binfmt
handler), imported with that platform and pushed to a registry: BuildKit with the classic image
store resolves a non-host image by name only from a registry, so that base is
`REGISTRY/envbuild/base:<suite>-py3-<hash>`, pinned by its registry digest, and reused from there.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .errors import InfraError, InputError
from .fsutil import exclusive
from .paths import cache_dir
from .values import IMAGE_RE, Base, registry_host, split_ref
from .probe.hardware import (DEFAULT_PLATFORM, PLATFORMS, host_platform, parse_platform, platform_arch,
                             platform_machine)

# Bump when the recipe below changes in a way that changes the image.
RECIPE = 1
DEFAULT_SUITE = "bookworm"
DEFAULT_REPO = "envbuild/base"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
UBUNTU_SUITES = {"focal", "jammy", "noble", "oracular", "plucky"}
BASE_KINDS = ("nvidia", "bootstrap")  # anything else names an image
BINFMT = Path("/proc/sys/fs/binfmt_misc")
CHROOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
              "HOME": "/root", "DEBIAN_FRONTEND": "noninteractive"}


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


def inputs(suite: str, mirror: str, packages: tuple[str, ...] = PACKAGES,
           platform: str = DEFAULT_PLATFORM) -> dict:
    """What the base is made of; its hash names the tag (linux/amd64's is what it always was)."""
    return {"recipe": RECIPE, "suite": suite, "mirror": mirror, "variant": "minbase",
            "packages": sorted(packages), "arch": platform_arch(platform)}


def input_hash(inp: dict) -> str:
    return hashlib.sha256(json.dumps(inp, sort_keys=True).encode()).hexdigest()


def default_tag(suite: str, inp: dict, registry: str | None = None) -> str:
    tag = f"{DEFAULT_REPO}:{suite}-py3-{input_hash(inp)[:12]}"
    return f"{registry}/{tag}" if registry else tag


def check_platform(platform: str | None) -> str:
    """Any spelling -> `linux/arm64`; InputError for one envbuild has no images for."""
    p = parse_platform(platform)
    if not p:
        raise InputError("--platform", None, "platform", platform, f"expected one of {', '.join(PLATFORMS)}")
    return p


def is_foreign(platform: str) -> bool:
    """True when this machine runs the platform's binaries only under emulation."""
    return check_platform(platform) != host_platform()


def _base_ref(suite: str, inp: dict, platform: str, tag: str | None, registry: str | None) -> str:
    """The reference the base has: the host platform's as always (a local tag); another
    platform's in a registry (BuildKit resolves a non-host image only from one)."""
    if not is_foreign(platform):
        return tag or default_tag(suite, inp)
    if registry is not None and not (re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]+)?", registry)
                                     and registry_host(f"{registry}/x")):
        raise InputError("--registry", None, "registry", registry, "expected a registry host, e.g. 127.0.0.1:5000")
    ref = tag or default_tag(suite, inp)
    if registry and not registry_host(split_ref(ref)[0]):
        ref = f"{registry}/{ref}"
    if not registry_host(split_ref(ref)[0]):
        raise InputError("--registry", None, "registry", registry,
                         f"a {platform} base on this {host_platform() or 'unknown'} host lives in a registry "
                         "(BuildKit finds a non-host image only there): pass --registry HOST, e.g. 127.0.0.1:5000")
    return ref


def default_bootstrap_ref(suite: str = DEFAULT_SUITE, platform: str = DEFAULT_PLATFORM,
                          registry: str | None = None) -> str:
    """The tag `envbuild base bootstrap --suite SUITE [--platform P --registry R]` makes on this
    host (built or not)."""
    mirror = host_mirror(suite)
    if not mirror:
        raise InputError("/etc/apt/sources.list*", None, "mirror", None,
                         f"no apt mirror for suite {suite!r} on this host; pass --mirror URL")
    platform = check_platform(platform)
    return _base_ref(suite, inputs(suite, mirror, platform=platform), platform, None, registry)


def emulation(platform: str, binfmt: Path | None = None) -> dict | None:
    """The kernel's handler for the platform's binaries, {"interpreter", "flags"}, or None.
    It is looked up by the name every installer gives it, qemu-<machine> (Debian's
    qemu-user-static, binfmt-support, the binfmt container images)."""
    try:
        lines = ((binfmt or BINFMT) / f"qemu-{platform_machine(platform)}").read_text().splitlines()
    except OSError:
        return None
    if not lines or lines[0].strip() != "enabled":
        return None
    info = dict(line.split(maxsplit=1) for line in lines[1:] if len(line.split(maxsplit=1)) == 2)
    return {"interpreter": info.get("interpreter", ""), "flags": info.get("flags:", "")}


def require_emulation(platform: str, binfmt: Path | None = None) -> dict:
    handler = emulation(platform, binfmt)
    if handler is None:
        machine = platform_machine(platform)
        raise InfraError("no-emulation", f"{platform} binaries need qemu on this {host_platform() or 'unknown'} "
                         f"host and no qemu-{machine} handler is registered in {binfmt or BINFMT}: run ci/emulation.sh "
                         "as root (qemu-user-static, binfmt_misc, the handler with the F flag)")
    return handler


def _registry_digest(ref: str) -> str | None:
    """The registry's digest for ref, None when it is not there; InfraError when the registry
    cannot be asked (found out before a long bootstrap, not after it)."""
    from .registry import Registry  # requests + oras: only a non-host base needs them

    repo, tag = split_ref(ref)
    host = registry_host(repo)
    try:
        d = Registry(host).head_manifest(repo[len(host) + 1:], tag.lstrip("@"))
    except InfraError as e:
        raise InfraError(e.cause, f"{e.message} (the base {ref} lives there: start it, ci/services.sh, "
                         "or pass another --registry)") from None
    return d.digest if d else None


def _sudo() -> list[str]:
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo"):
        return ["sudo", "-n"]
    raise InfraError("no-root", "debootstrap needs root (or passwordless sudo)")


def bootstrap(engine, suite: str = DEFAULT_SUITE, tag: str | None = None, mirror: str | None = None,
              log=print, platform: str = DEFAULT_PLATFORM, registry: str | None = None) -> Base:
    """Build (or reuse) the bootstrap base for a platform; returns it. The host's platform: a
    local image, as always. Another: built under emulation, pushed to `registry`, pinned by digest."""
    if not re.fullmatch(r"[a-z][a-z0-9-]*", suite):
        raise InputError("--suite", None, "suite", suite, "not a distribution suite name")
    platform = check_platform(platform)
    mirror = mirror or host_mirror(suite)
    if not mirror:
        raise InputError("/etc/apt/sources.list*", None, "mirror", None,
                         f"no apt mirror for suite {suite!r} on this host; pass --mirror URL")
    inp = inputs(suite, mirror, platform=platform)
    ref = _base_ref(suite, inp, platform, tag, registry)
    found = _reuse(engine, ref, platform, log)
    if found:
        return found
    # Two envbuild processes on one machine (two builds, two test workers) make one base: the
    # second waits here and then reuses the first's.
    with exclusive(cache_dir() / "base" / (hashlib.sha256(ref.encode()).hexdigest()[:16] + ".lock"),
                   f"the base image {ref}, which another envbuild is making"):
        return _reuse(engine, ref, platform, log) or _make(engine, suite, mirror, inp, ref, platform, log)


def _reuse(engine, ref: str, platform: str, log) -> Base | None:
    """The base when it is there already (pushing a foreign one built here whose push did not
    happen), else None."""
    if is_foreign(platform):
        digest = _registry_digest(ref)
        if digest:
            log(f"base {ref}: in its registry ({digest}), reused")
            return Base("bootstrap", ref, digest)
        if _arch_of(engine, ref) == platform_arch(platform):  # built here, its push did not happen
            return _push(engine, ref, log, "present here, pushed")
    elif engine.image_exists(ref):
        log(f"base {ref}: present, reused")
        return Base("bootstrap", ref)
    return None


def _make(engine, suite: str, mirror: str, inp: dict, ref: str, platform: str, log) -> Base:
    foreign = is_foreign(platform)
    handler = require_emulation(platform) if foreign else None
    if not shutil.which("debootstrap"):
        raise InfraError("no-debootstrap", "debootstrap not installed (ci/services.sh installs it)")
    sudo = _sudo()
    work = Path(tempfile.mkdtemp(prefix="envbuild-base-", dir=os.environ.get("TMPDIR", "/var/tmp")))
    root = work / "rootfs"
    try:
        log(f"base {ref}: debootstrap {suite} {'for ' + platform + ' ' if foreign else ''}from {mirror} "
            f"(minbase + {' '.join(PACKAGES)})")
        stage1 = [f"--arch={platform_arch(platform)}", "--foreign"] if foreign else []
        cmd = [*sudo, "debootstrap", *stage1, "--variant=minbase", f"--include={','.join(PACKAGES)}",
               suite, str(root), mirror]
        _run(cmd)
        if foreign:
            log(f"base {ref}: second stage under qemu ({handler['interpreter']}, flags {handler['flags'] or '-'})")
            if "F" not in handler["flags"]:
                log(f"base {ref}: note: the handler lacks the F flag, so containers and builds for {platform} "
                    "will not find the interpreter; ci/emulation.sh registers it with F")
            t = time.monotonic()
            _second_stage(root, sudo, handler)
            log(f"base {ref}: second stage done ({time.monotonic() - t:.0f} s)")
        _trim(root, sudo)
        # Tar the tree ourselves so ownership and modes survive exactly; docker import reads stdin.
        tar = subprocess.Popen([*sudo, "tar", "-C", str(root), "--numeric-owner", "-cf", "-", "."],
                               stdout=subprocess.PIPE)
        changes = ['ENV LANG=C.UTF-8', 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
                   'CMD ["/bin/bash"]', f'LABEL org.envbuild.base.suite={suite}',
                   f'LABEL org.envbuild.base.inputs={input_hash(inp)}']
        try:
            engine.import_tar(tar.stdout, ref, changes=changes, platform=platform if foreign else None)
        finally:
            tar.stdout.close()
            tar_rc = tar.wait()
        if tar_rc != 0:
            engine.remove(ref)
            raise InfraError("base-import", "tar of the bootstrapped tree failed")
        if foreign:
            log(f"base {ref}: imported as {platform}")
            return _push(engine, ref, log, "built and pushed")
        log(f"base {ref}: built")
        return Base("bootstrap", ref)
    finally:
        _unmount_under(root, sudo)
        subprocess.run([*sudo, "rm", "-rf", "--one-file-system", str(work)], check=False)


def _run(cmd: list[str], env: dict | None = None, hint: str = "") -> None:
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if p.returncode != 0:
        tail = " | ".join(p.stdout.strip().splitlines()[-5:])
        raise InfraError("debootstrap-failed", f"{' '.join(cmd)} exited {p.returncode}: {tail}{hint}")


def _arch_of(engine, ref: str) -> str | None:
    return (engine.inspect(ref) or {}).get("Architecture")


def _push(engine, ref: str, log, what: str) -> Base:
    t = time.monotonic()
    digest = engine.push(ref).split("@", 1)[1]
    log(f"base {ref}: {what} ({digest}; push {time.monotonic() - t:.0f} s)")
    return Base("bootstrap", ref, digest)


def _second_stage(root: Path, sudo: list[str], handler: dict) -> None:
    """debootstrap's second stage inside the foreign tree. With the handler's F flag the kernel
    already holds the interpreter; without it, the kernel looks for it inside the chroot, so a
    copy sits there for the run and is removed afterwards."""
    copied: list[Path] = []
    if "F" not in handler["flags"]:
        interp = handler["interpreter"]
        dst = root / interp.lstrip("/")
        copied = [dst, *[d for d in dst.parents if d != root and root in d.parents and not d.exists()]]
        subprocess.run([*sudo, "install", "-D", "-m", "0755", os.path.realpath(interp), str(dst)], check=True)
    try:
        _run([*sudo, "chroot", str(root), "/debootstrap/debootstrap", "--second-stage"], env=CHROOT_ENV,
             hint=" (the whole log: debootstrap/debootstrap.log in the tree)")
    finally:
        if copied:
            subprocess.run([*sudo, "rm", "-f", str(copied[0])], check=False)
            for d in copied[1:]:  # the folders the copy made, deepest first
                subprocess.run([*sudo, "rmdir", str(d)], check=False)


def _unmount_under(root: Path, sudo: list[str]) -> None:
    """A failed second stage can leave /proc or /sys mounted in the tree: unmount before rm."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return
    r = os.path.realpath(root)
    points = [m.split()[1] for m in mounts if len(m.split()) > 1]
    for pt in sorted((p for p in points if p == r or p.startswith(r + "/")), key=len, reverse=True):
        subprocess.run([*sudo, "umount", "-l", pt], check=False)


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
                 bootstrap_ref: str | None = None, platform: str = DEFAULT_PLATFORM,
                 registry: str | None = None) -> Base:
    """--base nvidia|bootstrap|IMAGE -> the base a build starts FROM; the one resolver.

    With an engine, bootstrap makes (or reuses) the base for `platform` (another than the
    host's: in `registry`, pinned by digest) and a pulled image is pinned by its registry
    digest; without one (render, ci bake) nothing runs: bootstrap names the tag
    `envbuild base bootstrap` makes here, images stay unpinned."""
    if spec == "bootstrap":
        if engine is None:
            return Base("bootstrap", bootstrap_ref or default_bootstrap_ref(suite, platform, registry))
        return bootstrap(engine, suite=suite, tag=bootstrap_ref, log=log, platform=platform, registry=registry)
    if spec == "nvidia":
        ref = getattr(combo, "base_image", None) if combo is not None else None
        if not ref:
            raise InputError("--base", None, "base", spec, "combination has no base_image in the matrix")
        return Base("nvidia", ref, registry_digest_of(engine, ref))
    if not spec or not IMAGE_RE.match(spec):
        raise InputError("--base", None, "base", spec, "expected nvidia, bootstrap or an image reference")
    return Base("image", spec, registry_digest_of(engine, spec))


# --- CLI: envbuild base bootstrap -------------------------------------------------------------
