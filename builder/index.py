"""The package index: release dates and package metadata (which index serves what is
index_config.py's).

- metadata (Requires-Dist, Requires-Python, upload time) is read from the index with the
  PEP 691 JSON API (or a PEP 503 HTML page, as the PyTorch index serves) plus HTTP range reads
  of the wheel's METADATA (no wheel is downloaded).

Metadata of a release never changes, so it is cached on disk and a recorded snapshot
(matrix/metadata.json) lets `plan` run offline and fast.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from html.parser import HTMLParser
from pathlib import Path

from .errors import EnvbuildError, InfraError
from .probe.vocab import ENGINE, dist_of, normalize_dist
from .probe.hardware import variant_of
from .fsutil import write_atomic, write_json_atomic
from .paths import cache_dir, metadata_snapshot
from .index_config import default_index_url, redact

TIMEOUT = 30


def check_reachable(url: str) -> None:
    """Raise index-unreachable unless the index answers (any HTTP status counts as an answer)."""
    try:
        _open(url.rstrip("/") + "/torch/", timeout=15).close()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        raise InfraError("index-unreachable", f"{redact(url)} does not answer: {getattr(e, 'reason', e)}") from None


# --------------------------------------------------------------------------- HTTP


def _opener():
    import ssl

    ctx = ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
                                     or os.environ.get("REQUESTS_CA_BUNDLE"))
    return urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx))


def _open(url: str, headers: dict | None = None, timeout: float = TIMEOUT, method: str = "GET"):
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    p = urllib.parse.urlsplit(url)
    if p.username:  # basic auth from the URL, as pip does
        import base64

        tok = base64.b64encode(f"{urllib.parse.unquote(p.username)}:{urllib.parse.unquote(p.password or '')}".encode())
        req.add_header("Authorization", "Basic " + tok.decode())
        req.full_url = urllib.parse.urlunsplit(p._replace(netloc=p.hostname + (f":{p.port}" if p.port else "")))
    return _opener().open(req, timeout=timeout)


class _RangeFile(io.RawIOBase):
    """A seekable read-only view of a remote file through HTTP range requests."""

    def __init__(self, url: str, size: int):
        self.url, self.size, self.pos = url, size, 0
        self._chunks: dict[int, bytes] = {}

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, off, whence=0):
        self.pos = off if whence == 0 else self.pos + off if whence == 1 else self.size + off
        return self.pos

    def read(self, n=-1):
        if n < 0:
            n = self.size - self.pos
        n = min(n, self.size - self.pos)
        if n <= 0:
            return b""
        start, end = self.pos, self.pos + n - 1
        with _open(self.url, {"Range": f"bytes={start}-{end}"}) as r:
            data = r.read()
            if r.status != 206:  # server ignored the range: slice what it sent
                data = data[start:end + 1]
        self.pos += len(data)
        return data

    def readinto(self, b):
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)


def _remote_size(url: str) -> int:
    """A file's size from a HEAD request (a PEP 503 page lists no sizes)."""
    with _open(url, method="HEAD") as r:
        return int(r.headers["Content-Length"])


def _wheel_metadata(url: str, size: int) -> str:
    """METADATA of a remote wheel: the zip's tail and one member, a few KB in all."""
    tail = min(size, 1 << 16)
    rf = _RangeFile(url, size)
    rf.seek(size - tail)
    buf = rf.read(tail)

    class _Tail(_RangeFile):
        def read(self, n=-1):  # serve the already fetched tail locally
            if self.pos >= size - tail:
                n = (size - self.pos) if n < 0 else n
                out = buf[self.pos - (size - tail): self.pos - (size - tail) + n]
                self.pos += len(out)
                return out
            return super().read(n)

    with zipfile.ZipFile(io.BufferedReader(_Tail(url, size), buffer_size=1 << 16)) as z:
        name = next(n for n in z.namelist() if re.match(r"^[^/]+\.dist-info/METADATA$", n))
        return z.read(name).decode("utf-8", "replace")


# --------------------------------------------------------------------------- metadata


_norm = normalize_dist  # PEP 503 names (the vocabulary's rule, shared with the probe)


_CACHE_KEY_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,63}==[A-Za-z0-9][A-Za-z0-9.!+_-]{0,63}\Z")


def _cache_name(key: str) -> str:
    """The metadata cache file of `name==version`: the key when it is short and plain, else its
    hash, so that no version string (400 characters, a slash, a newline) becomes a bad path."""
    if _CACHE_KEY_RE.fullmatch(key):
        return f"{key}.json"
    return "sha256-" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest() + ".json"


class _Anchors(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[dict] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.links.append(dict(attrs))


def _html_files(html: str, page_url: str) -> list[dict]:
    """A PEP 503 page as PEP 691 file entries (no upload times: a PEP 503 index has none)."""
    parser = _Anchors()
    parser.feed(html)
    files = []
    for a in parser.links:
        href = a.get("href") or ""
        url, _, frag = href.partition("#")
        algo, _, digest = frag.partition("=")
        files.append({"filename": urllib.parse.unquote(url.rsplit("/", 1)[-1]),
                      "url": urllib.parse.urljoin(page_url, url), "hashes": {algo: digest} if digest else {},
                      "yanked": "data-yanked" in a, "size": None})
    return files


def _wheel_rank(filename: str) -> int:
    """Prefer the wheel a Linux x86_64 CPython 3.11 image would install."""
    if not filename.endswith(".whl"):
        return 99
    score = 0
    if "x86_64" in filename or "none-any" in filename:
        score -= 10
    if "cp311" in filename or "abi3" in filename or "py3-none" in filename:
        score -= 5
    if "linux" in filename:
        score -= 2
    return score


def wheel_machines(filenames) -> list[str]:
    """Linux machines the wheels among `filenames` install on: `x86_64`, `aarch64`, ... and `any`
    for a pure-Python (or any-platform) wheel. Wheels for other systems are left out."""
    from packaging.utils import parse_wheel_filename

    out = set()
    for fn in filenames:
        if not fn.endswith(".whl"):
            continue
        try:
            tags = parse_wheel_filename(fn)[3]
        except Exception:  # noqa: BLE001 - a foreign file name says nothing
            continue
        for t in tags:
            if t.platform == "any":
                out.add("any")
            elif t.platform.startswith(("manylinux", "musllinux", "linux")):
                out.add(t.platform.split("_", 1)[1] if t.platform.startswith("linux_") else
                        re.sub(r"^(?:manylinux|musllinux)(?:_\d+_\d+|1|2010|2014)_", "", t.platform))
    return sorted(out)


def file_version(filename: object):
    """The release (a packaging Version) a wheel's or sdist's file name names; None for a name of
    another shape (a foreign file on an index page is skipped, never trusted)."""
    from packaging.utils import parse_sdist_filename, parse_wheel_filename

    if not isinstance(filename, str):
        return None
    try:
        return parse_wheel_filename(filename)[1] if filename.endswith(".whl") else parse_sdist_filename(filename)[1]
    except Exception:  # noqa: BLE001 - InvalidWheelFilename, InvalidSdistFilename, InvalidVersion
        return None


class Metadata:
    """Answers metadata questions for the planner and the locker.

    Lookup order: the recorded snapshot (matrix/metadata.json), the disk cache, the index.
    With online=False an unknown release is an error instead of a network request.
    """

    def __init__(self, snapshot: str | Path | None = None, online: bool = True, index: str | None = None):
        self.snapshot_path = Path(snapshot) if snapshot else metadata_snapshot()
        self.online = online
        self._index = index
        self._cache = cache_dir() / "metadata"
        self._mem: dict[str, dict] = {}
        self._files: dict[str, list] = {}
        self._answers: dict[tuple, object] = {}
        self.fetched: list[str] = []  # releases fetched from the index in this process
        try:
            self._snap = json.loads(self.snapshot_path.read_text())["releases"]
        except (OSError, ValueError, KeyError):
            self._snap = {}

    @property
    def index(self) -> str:
        return self._index or default_index_url()

    def files(self, name: str) -> list[dict]:
        """PEP 691 file list of a project."""
        key = _norm(name)
        if key not in self._files:
            url = f"{self.index}/{key}/"
            try:
                with _open(url, {"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"}) as r:
                    body, ctype = r.read(), r.headers.get("Content-Type", "")
                files = (_html_files(body.decode("utf-8", "replace"), url) if "html" in ctype
                         else json.loads(body)["files"])
                for f in files:  # PEP 691: a file's url may be relative to its page
                    if isinstance(f, dict) and isinstance(f.get("url"), str):
                        f["url"] = urllib.parse.urljoin(url, f["url"])
                self._files[key] = files
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    self._files[key] = []
                else:
                    raise InfraError("index-unreachable", f"{redact(url)}: HTTP {e.code}") from None
            except (urllib.error.URLError, OSError, ValueError) as e:
                raise InfraError("index-unreachable", f"{redact(url)}: {getattr(e, 'reason', e)}") from None
        return self._files[key]

    def versions(self, name: str) -> list[str]:
        return [str(v) for v in sorted(self.first_uploads(name))]

    def first_uploads(self, name: str) -> dict:
        """{Version: the day its first file was uploaded ("" when the index does not say)} of
        every release with a file that is not yanked."""
        out: dict = {}
        for f in self.files(name):
            v = file_version(f.get("filename"))
            if v is None or f.get("yanked"):
                continue
            t = str(f.get("upload-time") or "")[:10]
            out[v] = min(t, out[v]) if out.get(v) and t else (t or out.get(v, ""))
        return out

    def get(self, name: str, version: str) -> dict:
        key = f"{_norm(name)}=={version}"
        if key in self._mem:
            return self._mem[key]
        rec = self._snap.get(key)
        cpath = self._cache / _cache_name(key)
        if rec is None and cpath.exists():
            try:
                rec = json.loads(cpath.read_text())
            except (OSError, ValueError):
                rec = None  # a truncated or foreign cache file: read the index again
            if not isinstance(rec, dict):
                rec = None
        if rec is None:
            if not self.online:
                raise InfraError("metadata-missing", f"no recorded metadata for {key} (offline)")
            rec = self._fetch(name, version)

            write_json_atomic(cpath, rec)
            self.fetched.append(key)
        self._mem[key] = rec
        return rec

    def _release_files(self, name: str, version: str) -> list[dict]:
        """The index's files (wheels and sdists, not yanked) of one release."""
        from packaging.version import Version

        want = Version(version)
        return [f for f in self.files(name) if not f.get("yanked") and file_version(f.get("filename")) == want]

    def _fetch(self, name: str, version: str) -> dict:
        files = self._release_files(name, version)
        if not files:
            raise EnvbuildError(f"{name} {version} is not on the index ({redact(self.index)})")
        released = min((f["upload-time"] for f in files if f.get("upload-time")), default="")
        machines = wheel_machines(f["filename"] for f in files)
        best = min(files, key=lambda f: _wheel_rank(f["filename"]))
        if not best["filename"].endswith(".whl"):
            raise InfraError("metadata-missing", f"{name} {version} has no wheel to read metadata from")
        url = urllib.parse.urljoin(f"{self.index}/{_norm(name)}/", best["url"])
        try:
            text = _wheel_metadata(url, best.get("size") or _remote_size(url))
        except (urllib.error.URLError, OSError, zipfile.BadZipFile, StopIteration) as e:
            raise InfraError("index-unreachable", f"reading metadata of {best['filename']}: {e}") from None
        from email.parser import HeaderParser

        msg = HeaderParser().parsestr(text)
        return {
            "requires_dist": msg.get_all("Requires-Dist") or [],
            "requires_python": msg.get("Requires-Python") or "",
            "provides_extra": msg.get_all("Provides-Extra") or [],
            "released": released,
            "wheel_machines": machines,
        }

    # -- questions -----------------------------------------------------------------------

    def requires(self, name: str, version: str, extras: tuple[str, ...] = (), machine: str = "x86_64") -> list:
        """Requirements that apply on Linux `machine` CPython 3.11 with the given extras (read from
        the release's x86_64 wheel: its markers say what other machines get)."""
        from packaging.requirements import Requirement

        env = {"sys_platform": "linux", "platform_machine": machine, "platform_system": "Linux",
               "python_version": "3.11", "python_full_version": "3.11.0", "implementation_name": "cpython",
               "platform_python_implementation": "CPython", "os_name": "posix"}
        out = []
        for line in self.get(name, version)["requires_dist"]:
            r = Requirement(line)
            if r.marker is None or any(r.marker.evaluate({**env, "extra": e}) for e in ("",) + extras):
                out.append(r)
        return out

    def requires_python(self, name: str, version: str) -> str:
        return self.get(name, version)["requires_python"]

    def wheel_machines(self, name: str, version: str) -> list[str] | None:
        """The machines the release has wheels for (`any` for a pure-Python wheel); [] when it has
        sdists only; None when unknown (a record made before this was recorded, read offline)."""
        try:
            rec = self.get(name, version)
        except InfraError:  # not recorded and offline: unknown, which excludes nothing
            return None
        if "wheel_machines" in rec:
            return rec["wheel_machines"]
        if not self.online:
            return None
        rec["wheel_machines"] = wheel_machines(f["filename"] for f in self._release_files(name, version))
        return rec["wheel_machines"]

    def released(self, name: str, version: str) -> str:
        return self.get(name, version)["released"]

    def engine_extras(self, engine: str, version: str) -> tuple[str, ...]:
        """The engine's runtime extras this release provides (vocab.EngineSpec.runtime_extras:
        SGLang keeps its runtime deps, torch among them, in [srt] up to 0.5.2)."""
        spec = ENGINE.get(engine)
        return self.provided_extras(dist_of(engine), version, spec.runtime_extras) if spec else ()

    def provided_extras(self, name: str, version: str, wanted: tuple[str, ...]) -> tuple[str, ...]:
        """Those of `wanted` that this release declares (Provides-Extra), in `wanted`'s order."""
        if not wanted:
            return ()
        provided = {_norm(x) for x in self.get(name, version)["provides_extra"]}
        return tuple(x for x in wanted if _norm(x) in provided)

    def torch_pin(self, engine: str, version: str) -> str | None:
        key = ("torch_pin", engine, version)
        if key not in self._answers:  # planning asks this for every raw combination
            self._answers[key] = self._torch_pin(engine, version)
        return self._answers[key]

    def _torch_pin(self, engine: str, version: str) -> str | None:
        for r in self.requires(dist_of(engine), version, self.engine_extras(engine, version)):
            if _norm(r.name) == "torch":
                pins = [s.version for s in r.specifier if s.operator == "=="]
                if pins:
                    return pins[0]
        return None

    def default_cuda(self, torch_version: str, machine: str = "x86_64") -> str:
        """The CUDA variant of this torch release's wheels for `machine` on the default index."""
        for r in self.requires("torch", torch_version, machine=machine):
            n = _norm(r.name)
            m = re.match(r"^nvidia-cuda-runtime(-cu\d+)?$", n) or (n == "cuda-toolkit" and n)
            if m:
                pins = [s.version for s in r.specifier if s.operator in ("==", "~=", ">=")]
                if pins:
                    return variant_of("cuda", pins[0]).tag
        return "cpu"


def snapshot(meta: Metadata, keys: list[tuple[str, str]], out: Path) -> Path:
    """Write the recorded metadata snapshot for the given releases (sorted, stable bytes)."""
    rel = {f"{_norm(n)}=={v}": meta.get(n, v) for n, v in keys}
    doc = {"comment": "generated by envbuild (envbuild plan --refresh-metadata): metadata of the "
                      "releases the matrix names, read from the package index; do not edit",
           "releases": dict(sorted(rel.items()))}
    return write_atomic(out, json.dumps(doc, indent=1, sort_keys=True) + "\n")
