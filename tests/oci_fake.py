"""A small in-process OCI registry with the 1.1 referrers API, for tests.

It implements what envbuild.registry calls, per the OCI distribution spec 1.1: blob upload
(POST then PUT ?digest=) and HEAD/GET, manifest PUT/HEAD/GET by tag or digest, DELETE, and
GET /v2/<name>/referrers/<digest> (an image index of the manifests whose `subject` is that
digest, with their artifactType and annotations; ?artifactType= filters). A PUT of a
manifest with a subject answers the `OCI-Subject` header, as the spec requires.
`referrers=False` makes it a registry without the API (404 on that endpoint, no indexing).
`auth=(user, password)` makes it demand a Bearer token from its /token endpoint, which wants
those credentials by Basic auth: the token dance registries use.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import re
import threading
import uuid
from urllib.parse import parse_qs, urlparse

INDEX = "application/vnd.oci.image.index.v1+json"


class FakeRegistry:
    def __init__(self, referrers: bool = True, auth: tuple[str, str] | None = None):
        self.referrers_api = referrers
        self.auth = auth
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, tuple[bytes, str]] = {}  # digest -> (body, media type)
        self.tags: dict[tuple[str, str], str] = {}  # (name, tag) -> digest
        self.subjects: dict[str, list[str]] = {}  # subject digest -> manifest digests
        self.requests: list[tuple[str, str]] = []
        self.token = uuid.uuid4().hex
        reg = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body=b"", headers=None):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _authorized(self) -> bool:
                if not reg.auth:
                    return True
                if self.headers.get("Authorization") == f"Bearer {reg.token}":
                    return True
                realm = f"http://{self.headers.get('Host')}/token"
                self._send(401, b'{"errors":[{"code":"UNAUTHORIZED","message":"auth required"}]}',
                           {"WWW-Authenticate": f'Bearer realm="{realm}",service="fake"',
                            "Content-Type": "application/json"})
                return False

            def _handle(self):
                u = urlparse(self.path)
                reg.requests.append((self.command, u.path))
                if u.path == "/token":
                    want = "Basic " + base64.b64encode(f"{reg.auth[0]}:{reg.auth[1]}".encode()).decode()
                    if self.headers.get("Authorization") != want:
                        return self._send(401, b"{}")
                    return self._send(200, json.dumps({"token": reg.token}).encode(),
                                      {"Content-Type": "application/json"})
                if not self._authorized():
                    return
                length = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(length) if length else b""
                m = re.match(r"^/v2/(.+)/(manifests|blobs|referrers)/(.+)$", u.path)
                if u.path.endswith("/blobs/uploads/") and self.command == "POST":
                    name = u.path[len("/v2/"):-len("/blobs/uploads/")]
                    return self._send(202, headers={"Location": f"/v2/{name}/blobs/uploads/{uuid.uuid4().hex}"})
                if not m:
                    return self._send(404)
                name, what, ref = m.groups()
                if what == "blobs" and ref.startswith("uploads/") and self.command == "PUT":
                    digest = parse_qs(u.query).get("digest", [""])[0]
                    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
                        return self._send(400, b'{"errors":[{"code":"DIGEST_INVALID","message":"digest"}]}')
                    reg.blobs[digest] = data
                    return self._send(201, headers={"Docker-Content-Digest": digest})
                if what == "blobs":
                    if ref not in reg.blobs:
                        return self._send(404)
                    return self._send(200, reg.blobs[ref], {"Docker-Content-Digest": ref})
                if what == "referrers":
                    if not reg.referrers_api:
                        return self._send(404, b'{"errors":[{"code":"NOT_FOUND"}]}')
                    want = parse_qs(u.query).get("artifactType", [None])[0]
                    out = []
                    for d in reg.subjects.get(ref, []):
                        body, mt = reg.manifests[d]
                        mf = json.loads(body)
                        at = mf.get("artifactType") or mf.get("config", {}).get("mediaType")
                        if want and at != want:
                            continue
                        desc = {"mediaType": mt, "digest": d, "size": len(body), "artifactType": at}
                        if mf.get("annotations"):
                            desc["annotations"] = mf["annotations"]
                        out.append(desc)
                    return self._send(200, json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": out}).encode(),
                                      {"Content-Type": INDEX})
                # manifests
                if self.command == "PUT":
                    mt = self.headers.get("Content-Type", "")
                    digest = "sha256:" + hashlib.sha256(data).hexdigest()
                    if ref.startswith("sha256:") and ref != digest:
                        return self._send(400, b'{"errors":[{"code":"DIGEST_INVALID","message":"digest"}]}')
                    mf = json.loads(data)
                    for blob in [mf.get("config")] + list(mf.get("layers") or []):
                        if blob and blob.get("digest") not in reg.blobs:
                            return self._send(400, b'{"errors":[{"code":"MANIFEST_BLOB_UNKNOWN","message":"blob"}]}')
                    reg.manifests[digest] = (data, mt)
                    if not ref.startswith("sha256:"):
                        reg.tags[(name, ref)] = digest
                    headers = {"Docker-Content-Digest": digest, "Location": f"/v2/{name}/manifests/{digest}"}
                    subj = (mf.get("subject") or {}).get("digest")
                    if subj and reg.referrers_api:
                        if digest not in reg.subjects.setdefault(subj, []):
                            reg.subjects[subj].append(digest)
                        headers["OCI-Subject"] = subj
                    return self._send(201, headers=headers)
                digest = ref if ref.startswith("sha256:") else reg.tags.get((name, ref))
                if not digest or digest not in reg.manifests:
                    return self._send(404)
                if self.command == "DELETE":
                    del reg.manifests[digest]
                    for subs in reg.subjects.values():
                        if digest in subs:
                            subs.remove(digest)
                    for k in [k for k, v in reg.tags.items() if v == digest]:
                        del reg.tags[k]
                    return self._send(202)
                body, mt = reg.manifests[digest]
                return self._send(200, body, {"Content-Type": mt, "Docker-Content-Digest": digest})

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def put_image(self, name: str, tag: str = "latest") -> str:
        """A small image (config + one layer) pushed by tag; returns its manifest digest."""
        layer, config = b"layer-bytes-" + uuid.uuid4().bytes, json.dumps({"architecture": "amd64", "os": "linux"}).encode()
        for b in (layer, config):
            self.blobs["sha256:" + hashlib.sha256(b).hexdigest()] = b
        mf = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                         "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": len(config),
                                    "digest": "sha256:" + hashlib.sha256(config).hexdigest()},
                         "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "size": len(layer),
                                     "digest": "sha256:" + hashlib.sha256(layer).hexdigest()}]}).encode()
        d = "sha256:" + hashlib.sha256(mf).hexdigest()
        self.manifests[d] = (mf, "application/vnd.oci.image.manifest.v1+json")
        self.tags[(name, tag)] = d
        return d

    def close(self):
        self.server.shutdown()
