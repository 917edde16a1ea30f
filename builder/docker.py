"""The one place envbuild talks to the container engine (through the docker CLI): one Engine
class for builds, images, pushes and the containers the probe runs in.

Builds go through BuildKit: `docker buildx build` where the client has buildx, else
`DOCKER_BUILDKIT=1 docker build` through a client whose built-in builder is BuildKit. The
first docker on PATH may be a newer client without buildx whose legacy builder refuses
BuildKit, so other clients (Debian's /usr/bin/docker) are tried too. Builds always use the
host network: daemons here run without a bridge, and only 127.0.0.1 is a legitimate target.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import InfraError
from .runlog import BuildResult, run_logged
from . import push as pushing
from .values import split_ref
from .probe.hardware import host_platform, platform_arch

DAEMON_DOWN = re.compile(r"Cannot connect to the Docker daemon|Is the docker daemon running|"
                         r"error during connect|connect: no such file or directory|"
                         r"permission denied while trying to connect", re.I)


def _candidates() -> list[str]:
    out: list[str] = []
    for c in (os.environ.get("ENVBUILD_DOCKER"), shutil.which("docker"), "/usr/bin/docker"):
        if c and os.path.isfile(c) and os.access(c, os.X_OK) and os.path.realpath(c) not in map(os.path.realpath, out):
            out.append(c)
    return out


def _q(cmd: list[str], env: dict | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"{cmd[0]} {cmd[1]}: no answer in {timeout}s")


def default_client(docker: str = "docker") -> str:
    """Debian's client (has BuildKit here); /usr/local/bin/docker may be a newer client without."""
    if docker == "docker" and os.path.exists("/usr/bin/docker"):
        return "/usr/bin/docker"
    return docker


def detect(client: str | None = None) -> "Engine":
    """Pick a client that can build with BuildKit against a daemon that answers; one clear
    InfraError otherwise."""
    cands = [client] if client else _candidates()
    if not cands:
        raise InfraError("no-docker", "no docker client found (install docker.io or run ci/services.sh)")
    tried: list[str] = []
    for c in cands:
        v = _q([c, "version", "--format", "{{.Server.Version}}"])
        if v.returncode != 0:
            msg = (v.stderr or v.stdout).strip().splitlines()
            line = msg[-1] if msg else f"exit {v.returncode}"
            if DAEMON_DOWN.search(v.stderr or "") or v.returncode == 124:
                raise InfraError("daemon-error", f"no Docker daemon answers ({c}: {line}); "
                                 "start one with ci/services.sh")
            tried.append(f"{c}: {line}")
            continue
        server = v.stdout.strip()
        if _q([c, "buildx", "version"]).returncode == 0:
            return Engine(client=c, mode="buildx", server_version=server)
        env = {**os.environ, "DOCKER_BUILDKIT": "1"}
        h = _q([c, "build", "--help"], env=env)
        if h.returncode == 0 and "--secret" in h.stdout:
            return Engine(client=c, mode="buildkit", server_version=server)
        tried.append(f"{c}: no buildx and its `docker build` is not BuildKit")
    raise InfraError("no-buildkit", "no docker client can build with BuildKit (" + "; ".join(tried) +
                     "); install docker-buildx or Debian's docker.io")


@dataclass
class Engine:
    client: str
    mode: str  # "buildx" | "buildkit"
    server_version: str = ""
    last_push_tool: str = ""  # what the last push ran: docker | envbuild (see push_report)

    # -- plumbing ---------------------------------------------------------------------------
    def _env(self) -> dict:
        env = dict(os.environ)
        if self.mode == "buildkit":
            env["DOCKER_BUILDKIT"] = "1"
        return env

    def cmd(self, *args: str, timeout: float = 600, input: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run([self.client, *args], capture_output=True, text=True, env=self._env(),
                           timeout=timeout, input=input)
        if check and p.returncode != 0:
            raise self._error(args, p)
        return p

    def _error(self, args, p) -> InfraError:
        err = (p.stderr or p.stdout or "").strip().splitlines()
        line = err[-1] if err else f"exit {p.returncode}"
        return InfraError("daemon-error", f"docker {' '.join(args[:2])}: {line}")

    def describe(self) -> str:
        how = "docker buildx build" if self.mode == "buildx" else "DOCKER_BUILDKIT=1 docker build"
        return f"{how} via {self.client} (engine {self.server_version})"

    # -- build ------------------------------------------------------------------------------
    def build_argv(self, context: str | os.PathLike, *, dockerfile: str | os.PathLike | None = None,
                   tags: list[str] = (), labels: dict[str, str] | None = None,
                   secrets: dict[str, str] | None = None, build_args: dict[str, str] | None = None,
                   iidfile: str | None = None, no_cache: bool = False,
                   platform: str | None = None) -> list[str]:
        argv = [self.client, *(["buildx", "build", "--load"] if self.mode == "buildx" else ["build"])]
        argv += ["--network", "host", "--progress", "plain"]
        if platform:  # another platform builds under qemu (ci/emulation.sh), FROM a registry base
            argv += ["--platform", platform]
        if dockerfile:
            argv += ["-f", str(dockerfile)]
        for t in tags:
            argv += ["-t", t]
        for k, v in sorted((labels or {}).items()):
            argv += ["--label", f"{k}={v}"]
        for sid, src in sorted((secrets or {}).items()):
            argv += ["--secret", f"id={sid},src={src}"]
        for k, v in sorted((build_args or {}).items()):
            argv += ["--build-arg", f"{k}={v}"]
        if iidfile:
            argv += ["--iidfile", iidfile]
        if no_cache:
            argv.append("--no-cache")
        argv.append(str(context))
        return argv

    def build(self, context: str | os.PathLike, *, log_path: str | os.PathLike,
              timeout: float | None = None, on_line: Callable[[str], None] | None = None,
              stop: threading.Event | None = None, **kw) -> BuildResult:
        """Run one build, streaming its output to log_path. Never raises for a failed build:
        the caller classifies the result from rc and tail."""
        with tempfile.TemporaryDirectory(prefix="envbuild-iid-") as td:
            iid = os.path.join(td, "iid")
            argv = self.build_argv(context, iidfile=iid, **kw)
            res = run_logged(argv, log_path, env=self._env(), timeout=timeout, on_line=on_line, stop=stop)
            image_id = None
            if res.rc == 0 and os.path.exists(iid):
                image_id = Path(iid).read_text().strip() or None
        res.image_id = image_id
        res.ok = res.rc == 0 and not res.timed_out
        return res

    # -- images -----------------------------------------------------------------------------
    def inspect(self, ref: str) -> dict | None:
        p = self.cmd("image", "inspect", ref, check=False)
        if p.returncode != 0:
            if DAEMON_DOWN.search(p.stderr):
                raise self._error(("image", "inspect"), p)
            return None
        data = json.loads(p.stdout)
        return data[0] if data else None

    def image_exists(self, ref: str) -> bool:
        return self.inspect(ref) is not None

    def image_size(self, ref: str) -> int | None:
        d = self.inspect(ref)
        return int(d["Size"]) if d else None

    def image_id(self, ref: str) -> str | None:
        d = self.inspect(ref)
        return d["Id"] if d else None

    def layers(self, ref: str) -> list[str]:
        d = self.inspect(ref)
        return list((d or {}).get("RootFS", {}).get("Layers", []))

    def labels(self, ref: str) -> dict:
        d = self.inspect(ref)
        return dict(((d or {}).get("Config") or {}).get("Labels") or {})

    def tag(self, src: str, dst: str) -> None:
        self.cmd("tag", src, dst)

    def remove(self, *refs: str, force: bool = False) -> None:
        if refs:
            self.cmd("image", "rm", *(["-f"] if force else []), *refs, check=False)

    def history(self, ref: str) -> str:
        return self.cmd("history", "--no-trunc", ref).stdout

    def save(self, ref: str, path: str | os.PathLike, timeout: float = 1800) -> None:
        self.cmd("save", "-o", str(path), ref, timeout=timeout)

    def import_tar(self, stream, ref: str, changes: list[str] = (), platform: str | None = None) -> str:
        """`docker import` a root filesystem tar (stdin) as `ref`; -> the image id. With a
        platform, the image's config says that OS and architecture: daemons before 23 take only
        the OS from `docker import --platform` and write their own architecture, so the config is
        then rewritten (docker save | new config | docker load; the layer is untouched)."""
        argv = [self.client, "import"]
        if platform:
            argv += ["--platform", platform]
        for c in changes:
            argv += ["--change", c]
        argv += ["-", ref]
        p = subprocess.run(argv, stdin=stream, capture_output=True, text=True, env=self._env())
        if p.returncode != 0:
            raise self._error(("import",), p)
        image_id = p.stdout.strip()
        if platform:
            image_id = self._set_platform(ref, platform) or image_id
        return image_id

    def _set_platform(self, ref: str, platform: str) -> str | None:
        """Make the local image's config name this platform; -> the new image id (None: it already did)."""
        want_os, want_arch = platform.split("/")[0], platform_arch(platform)
        d = self.inspect(ref) or {}
        if (d.get("Os"), d.get("Architecture")) == (want_os, want_arch):
            return None
        old = d.get("Id")
        save = subprocess.Popen([self.client, "save", ref], stdout=subprocess.PIPE, env=self._env())
        load = subprocess.Popen([self.client, "load", "-q"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=self._env())
        rewritten = 0
        try:
            with tarfile.open(fileobj=save.stdout, mode="r|") as src, \
                    tarfile.open(fileobj=load.stdin, mode="w|", format=tarfile.PAX_FORMAT) as dst:
                for m in src:
                    f = src.extractfile(m) if m.isfile() else None
                    if f is not None and re.fullmatch(r"[0-9a-f]{64}\.json", m.name):  # the image config
                        cfg = json.load(f)
                        cfg["os"], cfg["architecture"] = want_os, want_arch
                        data = json.dumps(cfg, separators=(",", ":")).encode()
                        m.size = len(data)
                        dst.addfile(m, io.BytesIO(data))
                        rewritten += 1
                    else:
                        dst.addfile(m, f)
        except (OSError, tarfile.TarError) as e:  # a broken pipe: load's stderr says why
            save.kill()
            err = _finish(load)[1]
            raise InfraError("daemon-error", f"docker save | load {ref} (platform {platform}): {err or e}") from None
        err = _finish(load)[1]
        if save.wait() != 0 or load.returncode != 0 or rewritten != 1:
            why = err or f"{rewritten} image configs in the saved tar"
            raise InfraError("daemon-error", f"docker save | load {ref} (platform {platform}): {why}")
        d = self.inspect(ref) or {}
        if (d.get("Os"), d.get("Architecture")) != (want_os, want_arch):
            raise InfraError("daemon-error", f"{ref}: imported for {platform} but the engine says "
                                             f"{d.get('Os')}/{d.get('Architecture')}")
        if old and old != d.get("Id"):
            self.remove(old)  # the first import, now untagged (its layer stays: the new image shares it)
        return d.get("Id")

    # -- containers ---------------------------------------------------------------------------
    @classmethod
    def for_containers(cls, client: str = "docker") -> "Engine":
        """An engine to run containers and read images with (the probe, attach, fanout): any
        client will do, no BuildKit needed, so nothing is detected up front."""
        return cls(client=default_client(client), mode="run")

    def run_argv(self, image: str, argv: list[str], *, name: str, entrypoint: str | None = None,
                 mounts: list[tuple[str, str, bool]] = (), env: dict[str, str] | None = None,
                 workdir: str | None = None, read_only: bool = False, tmpfs: list[str] = (),
                 shm_size: str | None = None, devices: list[str] = (), platform: str | None = None,
                 pull: str = "missing", network: str = "host") -> list[str]:
        """`docker run` of a throw-away container on the host network (the only network here), or
        with `network="none"` on none at all (loopback only).
        mounts: (host path, container path, read-only); devices: the accelerator's arguments
        (host.container_device_args()); platform: another machine's image runs emulated."""
        cmd = [self.client, "run", "--rm", *devices, "--pull", pull, "--name", name, "--network", network]
        if platform and platform != host_platform():
            cmd += ["--platform", platform]
        if read_only:
            cmd.append("--read-only")
        for t in tmpfs:
            cmd += ["--tmpfs", t]
        if shm_size:
            cmd += ["--shm-size", shm_size]
        for k, v in (env or {}).items():
            cmd += ["-e", f"{k}={v}"]
        if workdir:
            cmd += ["-w", workdir]
        for src, dst, ro in mounts:
            cmd += ["-v", f"{src}:{dst}" + (":ro" if ro else "")]
        if entrypoint:
            cmd += ["--entrypoint", entrypoint]
        return cmd + [image, *argv]

    def kill(self, name: str) -> None:
        """Stop and remove a container by name (a probe past its timeout); never raises."""
        for args in (("kill", name), ("rm", "-f", name)):
            try:
                subprocess.run([self.client, *args], capture_output=True, timeout=60)
            except (OSError, subprocess.SubprocessError):
                pass

    def remove_containers(self, name_prefix: str, ancestor: str) -> None:
        """Remove the containers of this image whose name starts with the prefix (orphans of a
        killed probe: its client died, the container did not); never raises."""
        try:
            p = subprocess.run([self.client, "ps", "-q", "--filter", f"name={name_prefix}", "--filter",
                                f"ancestor={ancestor}"], capture_output=True, text=True, timeout=60)
            ids = p.stdout.split()
            if ids:
                subprocess.run([self.client, "rm", "-f", *ids], capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            pass

    def read_files(self, image: str, paths: list[str]) -> dict[str, bytes | None]:
        """Files out of an image without running it: `docker create` + `docker cp` (a tar stream)."""
        p = self.cmd("create", image, "/envbuild-never-runs", check=False)
        if p.returncode != 0:
            raise InfraError("daemon-error", f"docker create {image}: {(p.stderr or p.stdout).strip()[-300:]}")
        cid = p.stdout.strip()
        out: dict[str, bytes | None] = {}
        try:
            for path in paths:
                cp = subprocess.run([self.client, "cp", "-L", f"{cid}:{path}", "-"], capture_output=True)
                if cp.returncode != 0:
                    out[path] = None
                    continue
                with tarfile.open(fileobj=io.BytesIO(cp.stdout)) as tf:
                    member = next((m for m in tf.getmembers() if m.isfile()), None)
                    out[path] = tf.extractfile(member).read() if member else None
        finally:
            self.cmd("rm", "-f", cid, check=False)
        return out

    def pull(self, ref: str, timeout: float = 1800) -> None:
        self.cmd("pull", "-q", ref, timeout=timeout)

    def push(self, ref: str, timeout: float = 3600, compression: str = "auto") -> str:
        """Push a tag; return the pushed digest as `repo@sha256:...` (envbuild.push says how)."""
        return self.push_report(ref, timeout, compression).digest

    def push_report(self, ref: str, timeout: float = 3600, compression: str = "auto") -> "pushing.PushReport":
        rep = pushing.push(self, ref, compression, timeout)
        self.last_push_tool = rep.tool
        return rep

    @contextlib.contextmanager
    def save_stream(self, ref: str):
        """`docker save REF` as a stream of tar bytes, never written to disk here."""
        p = subprocess.Popen([self.client, "save", ref], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=self._env())
        ok = False
        try:
            yield p.stdout
            ok = True
        finally:
            if not ok and p.poll() is None:
                p.kill()
            p.stdout.close()
            err = p.stderr.read().decode(errors="replace").strip().splitlines()
            p.stderr.close()
            rc = p.wait()
        if rc != 0:
            raise InfraError("daemon-error", f"docker save {ref}: {err[-1] if err else f'exit {rc}'}")

    def cache_entries(self) -> list[dict]:
        """BuildKit's cache records (ID, CacheType, Description, Size, InUse, ...)."""
        p = self.cmd("system", "df", "-v", "--format", "{{json .BuildCache}}", timeout=120)
        return json.loads(p.stdout or "[]") or []

    def prune_cache(self, ids: list[str]) -> None:
        """Prune exactly these cache records (never the whole cache: other users share it)."""
        for i in ids:
            self.cmd("builder", "prune", "-f", "--filter", f"id={i}", check=False, timeout=600)

    def registry_has(self, ref: str) -> bool:
        return pushing.registry_digest(ref) is not None

    def remote_digest(self, ref: str) -> str:
        dig = pushing.registry_digest(ref)
        if not dig:
            raise InfraError("daemon-error", f"{ref}: not in its registry")
        return f"{split_ref(ref)[0]}@{dig}"

    def repo_digests(self, ref: str) -> list[str]:
        return list((self.inspect(ref) or {}).get("RepoDigests") or [])


def _finish(proc: subprocess.Popen) -> tuple[str, str]:
    """Close a process's stdin (we wrote it ourselves), wait, -> (stdout, stderr) as text."""
    proc.stdin.close()
    proc.stdin = None  # so communicate() does not flush what is closed
    out, err = proc.communicate()
    return out.decode(errors="replace").strip(), err.decode(errors="replace").strip()
