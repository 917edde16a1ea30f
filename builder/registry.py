"""An OCI distribution client for the few calls envbuild makes (through oras-py).

oras-py's Registry does the HTTP and the authentication: the user's Docker credentials
(~/.docker/config.json `auths`, `credHelpers`, `credsStore`, or $DOCKER_CONFIG) and the
registries' token dance, so a private registry answers like a public one. Two things are set
here: plain http only for loopback registries (and no proxy for them), and a timeout on every
request with no retry loop - oras' own do_request retries five times with sleeps of up to 83 s,
which would turn "registry unreachable" into minutes; envbuild reports it at once instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass

import oras.provider
import requests
import requests.adapters

from .errors import InfraError
from .values import registry_host

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"  # Docker image manifest, schema 2
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"  # Docker manifest list
MANIFEST_TYPES = [DOCKER_MANIFEST, DOCKER_LIST, OCI_MANIFEST, OCI_INDEX]
DEFAULT_TIMEOUT = 20.0


def is_loopback(host: str) -> bool:
    h = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return h in ("localhost", "[::1]") or h.startswith("127.")


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int

    def to_dict(self) -> dict:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


class _Timeout(requests.adapters.HTTPAdapter):
    def __init__(self, timeout: float):
        super().__init__()
        self._timeout = timeout

    def send(self, request, **kw):
        if kw.get("timeout") is None:
            kw["timeout"] = self._timeout
        return super().send(request, **kw)


class _Oras(oras.provider.Registry):
    # One attempt: the caller decides what an unreachable registry means.
    do_request = oras.provider.Registry.do_request.__wrapped__


MAX_MANIFEST_BYTES = 4 << 20  # an image or attestation manifest is a few kB; a referrers index too
MAX_READ_SECONDS = 60.0  # one registry conversation (a verify): past it, whatever is left is refused


def _abort(r: requests.Response) -> None:
    """End a read blocked on a server that drips bytes: closing the response from another thread
    does not wake a recv(); shutting the socket down does."""
    import socket
    for path in (("raw", "_fp", "fp", "raw", "_sock"), ("raw", "_connection", "sock")):
        obj = r
        for attr in path:
            obj = getattr(obj, attr, None)
            if obj is None:
                break
        if obj is not None:
            try:
                obj.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
    r.close()


class Registry:
    """One registry host. `name` arguments are repository paths without the host.

    Reads are bounded the way remote tables are: every body is read in pieces up to a size cap
    (manifests 4 MiB, blobs by the caller's cap), and all requests of one Registry share one
    deadline (`deadline_s`), enforced by closing the response of a server that drips bytes."""

    def __init__(self, host: str, timeout: float = DEFAULT_TIMEOUT, deadline_s: float = MAX_READ_SECONDS):
        self.host = host
        self._ends = time.monotonic() + deadline_s
        loop = is_loopback(host)
        self._r = _Oras(hostname=host, insecure=loop)
        s = self._r.session
        if loop:
            s.trust_env = False  # no proxy between us and 127.0.0.1
        adapter = _Timeout(timeout)
        s.mount("http://", adapter)
        s.mount("https://", adapter)
        self._auth_loaded: set[str] = set()
        self.base = f"{'http' if loop else 'https'}://{host}/v2"

    # -- plumbing -------------------------------------------------------------------------
    def _load_auth(self, name: str) -> None:
        if name in self._auth_loaded:
            return
        cfg = os.environ.get("DOCKER_CONFIG")
        configs = [os.path.join(cfg, "config.json")] if cfg else None
        try:
            self._r.auth.load_configs(self._r.get_container(f"{self.host}/{name}"), configs=configs)
        except (OSError, ValueError, KeyError) as e:
            raise InfraError("registry-auth", f"{self.host}: cannot read Docker credentials ({e})")
        self._auth_loaded.add(name)

    def request(self, method: str, name: str, path: str, *, headers: dict | None = None,
                data: bytes | None = None, url: str | None = None, stream: bool = False) -> requests.Response:
        self._load_auth(name)
        url = url or f"{self.base}/{name}/{path}"
        if time.monotonic() > self._ends:
            raise InfraError("registry-unreachable", f"{self.host}: no answer within the deadline")
        try:
            r = self._r.do_request(url, method, data=data, headers=dict(headers or {}), stream=stream)
        except requests.exceptions.RequestException as e:
            raise InfraError("registry-unreachable", f"{self.host}: {type(e).__name__}: {e}")
        except ValueError as e:  # oras: "Cannot respond to request for authentication."
            raise InfraError("registry-auth", f"{method} {url}: {e}")
        if r.status_code in (401, 403):
            raise InfraError("registry-auth", f"{method} {url}: HTTP {r.status_code} (check `docker login {self.host}`)")
        return r

    def _read(self, r: requests.Response, cap: int, what: str) -> bytes:
        """The body, at most `cap` bytes, within the deadline (a watchdog closes a response that
        drips; reading then fails and is infrastructure)."""
        left = self._ends - time.monotonic()
        if left <= 0:
            r.close()
            raise InfraError("registry-unreachable", f"{self.host}: {what}: no answer within the deadline")
        timer = threading.Timer(left, _abort, (r,))
        timer.daemon = True
        timer.start()
        out = bytearray()
        try:
            for chunk in r.iter_content(65536):
                out += chunk
                if len(out) > cap:
                    raise InfraError("registry-error", f"{self.host}: {what}: larger than {cap >> 20} MiB: refused")
        except (requests.exceptions.RequestException, AttributeError, ValueError, OSError) as e:
            raise InfraError("registry-unreachable",
                             f"{self.host}: {what}: the body did not arrive within the deadline ({type(e).__name__})")
        finally:
            timer.cancel()
            r.close()
        if time.monotonic() > self._ends:
            raise InfraError("registry-unreachable", f"{self.host}: {what}: no answer within the deadline")
        return bytes(out)

    def _fail(self, r: requests.Response, what: str) -> InfraError:
        try:
            errs = "; ".join(e.get("message", "") for e in r.json().get("errors", []))
        except (ValueError, AttributeError):
            errs = r.text[:200]
        return InfraError("registry-error", f"{what}: HTTP {r.status_code} {errs}".rstrip())

    # -- manifests ------------------------------------------------------------------------
    def head_manifest(self, name: str, ref: str) -> Descriptor | None:
        r = self.request("HEAD", name, f"manifests/{ref}", headers={"Accept": ", ".join(MANIFEST_TYPES)})
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise self._fail(r, f"HEAD {name}:{ref}")
        digest = r.headers.get("Docker-Content-Digest")
        if not digest and ref.startswith("sha256:"):
            digest = ref
        if not digest:  # some registries omit the header on HEAD: ask for the bytes
            got = self.get_manifest(name, ref)
            return got[0] if got else None
        return Descriptor(r.headers.get("Content-Type", "").split(";")[0], digest,
                          int(r.headers.get("Content-Length") or 0))

    def get_manifest(self, name: str, ref: str) -> tuple[Descriptor, bytes] | None:
        r = self.request("GET", name, f"manifests/{ref}", headers={"Accept": ", ".join(MANIFEST_TYPES)}, stream=True)
        if r.status_code == 404:
            r.close()
            return None
        if r.status_code != 200:
            raise self._fail(r, f"GET {name}:{ref}")
        body = self._read(r, MAX_MANIFEST_BYTES, f"manifest {name}:{ref}")
        digest = sha256_digest(body)
        if ref.startswith("sha256:") and ref != digest:
            raise InfraError("registry-error", f"{name}@{ref}: the registry served bytes with digest {digest}")
        mt = r.headers.get("Content-Type", "").split(";")[0]
        try:
            mt = json.loads(body).get("mediaType") or mt
        except (ValueError, AttributeError):
            pass
        return Descriptor(mt, digest, len(body)), body

    def put_manifest(self, name: str, ref: str, body: bytes, media_type: str = OCI_MANIFEST) -> requests.Response:
        r = self.request("PUT", name, f"manifests/{ref}", headers={"Content-Type": media_type}, data=body)
        if r.status_code not in (200, 201, 202):
            raise self._fail(r, f"PUT {name}:{ref}")
        return r

    def delete_manifest(self, name: str, digest: str) -> bool:
        return self.request("DELETE", name, f"manifests/{digest}").status_code in (200, 202)

    # -- blobs ----------------------------------------------------------------------------
    def put_blob(self, name: str, data: bytes, media_type: str) -> Descriptor:
        d = Descriptor(media_type, sha256_digest(data), len(data))
        if self.request("HEAD", name, f"blobs/{d.digest}").status_code == 200:
            return d
        r = self.request("POST", name, "blobs/uploads/")
        loc = r.headers.get("Location")
        if r.status_code != 202 or not loc:
            raise self._fail(r, f"POST {name} blob upload")
        loc = self._absolute(loc)
        loc += ("&" if "?" in loc else "?") + f"digest={d.digest}"
        r = self.request("PUT", name, "", url=loc, data=data,
                         headers={"Content-Type": "application/octet-stream", "Content-Length": str(len(data))})
        if r.status_code not in (201, 204):
            raise self._fail(r, f"PUT {name} blob {d.digest}")
        return d

    def blob_size(self, name: str, digest: str) -> int | None:
        """The size of a blob the repository holds, or None."""
        r = self.request("HEAD", name, f"blobs/{digest}")
        if r.status_code != 200:
            return None
        return int(r.headers.get("Content-Length") or 0)

    def mount_blob(self, name: str, digest: str, source: str) -> bool:
        """Link a blob that repository `source` of this registry holds into `name` without
        uploading it (a cross-repository mount). False where the registry declines; an upload
        session it opened instead is cancelled."""
        try:
            r = self.request("POST", name, f"blobs/uploads/?mount={digest}&from={source}")
        except InfraError:  # a token scoped to `name` alone may be refused the source: upload instead
            return False
        if r.status_code == 201:
            return True
        loc = r.headers.get("Location")
        if r.status_code == 202 and loc:
            self.request("DELETE", name, "", url=self._absolute(loc))
        return False

    def upload_stream(self, name: str, chunks, digest_of) -> Descriptor:
        """Upload a blob whose digest is known only once its bytes are sent: one POST, one
        streamed (chunked) PATCH, one PUT with the digest `digest_of()` gives after `chunks`
        ran out. -> the descriptor (media type left to the caller)."""
        r = self.request("POST", name, "blobs/uploads/")
        loc = r.headers.get("Location")
        if r.status_code != 202 or not loc:
            raise self._fail(r, f"POST {name} blob upload")
        r = self.request("PATCH", name, "", url=self._absolute(loc), data=chunks,
                         headers={"Content-Type": "application/octet-stream"})
        loc = r.headers.get("Location")
        if r.status_code != 202 or not loc:
            raise self._fail(r, f"PATCH {name} blob upload")
        digest, size = digest_of()
        loc = self._absolute(loc)
        r = self.request("PUT", name, "", url=loc + ("&" if "?" in loc else "?") + f"digest={digest}",
                         headers={"Content-Length": "0"})
        if r.status_code not in (201, 204):
            raise self._fail(r, f"PUT {name} blob {digest}")
        return Descriptor("", digest, size)

    def _absolute(self, loc: str) -> str:
        return self.base[: -len("/v2")] + loc if loc.startswith("/") else loc

    def get_blob(self, name: str, digest: str, max_bytes: int = 64 << 20) -> bytes | None:
        r = self.request("GET", name, f"blobs/{digest}", stream=True)
        if r.status_code == 404:
            r.close()
            return None
        if r.status_code != 200:
            raise self._fail(r, f"GET {name} blob {digest}")
        body = self._read(r, max_bytes, f"blob {digest[:19]}…")
        if len(body) > max_bytes or sha256_digest(body) != digest:
            raise InfraError("registry-error", f"{name} blob {digest}: content does not match its digest")
        return body

    # -- referrers (OCI 1.1) --------------------------------------------------------------
    def referrers(self, name: str, digest: str) -> list[dict] | None:
        """The descriptors that name `digest` as their subject; None when the registry has
        no referrers API (it answers 404 for the endpoint, or something that is not an index)."""
        r = self.request("GET", name, f"referrers/{digest}", headers={"Accept": OCI_INDEX}, stream=True)
        if r.status_code != 200:
            r.close()
            return None
        try:
            idx = json.loads(self._read(r, MAX_MANIFEST_BYTES, f"referrers of {digest[:19]}…"))
        except ValueError:
            return None
        if not isinstance(idx, dict) or not isinstance(idx.get("manifests"), list):
            return None
        return [m for m in idx["manifests"] if isinstance(m, dict)]


def split_repo(repo: str) -> tuple[str, str]:
    """'host:5000/a/b' -> ('host:5000', 'a/b'); a repo without a registry host is input error."""

    host = registry_host(repo)
    if not host:
        raise ValueError(f"{repo}: no registry host (expected HOST[:PORT]/NAME)")
    return host, repo[len(host) + 1:]
