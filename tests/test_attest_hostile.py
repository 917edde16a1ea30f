"""A hostile registry behind `verify IMAGE@…` (issue 27): every answer ends within a deadline
and a size cap, as one line (exit 3 for infrastructure, 2 for what is not to be believed), and
never as a traceback. A real HTTP server on 127.0.0.1 answers each way."""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from envbuild import attest
from envbuild.errors import InfraError
from envbuild.registry import Registry
from envbuild.sign import VerifyError, write_keypair

from fuzz_registry import DIGEST, IMAGE  # the image every hostile registry serves


def serve(att: bytes | None = None, referrers: bytes | None = None, drip: bool = False):
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_HEAD(self):
            self.do_GET(head=True)

        def do_GET(self, head=False):
            if self.path.endswith(f"/manifests/{DIGEST}"):
                return self._send(IMAGE, head, {"Docker-Content-Digest": DIGEST})
            if "/referrers/" in self.path:
                return self._send(referrers, head) if referrers is not None else self._send(None, head)
            if self.path.endswith(".att"):
                if drip:
                    self.send_response(200)
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    try:
                        for _ in range(1000):
                            self.wfile.write(b" ")
                            self.wfile.flush()
                            time.sleep(0.2)
                    except OSError:  # the client gave up: what the test wants
                        pass
                    return
                return self._send(att, head)
            self._send(None, head)

        def _send(self, body, head=False, headers=None):
            if body is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if not head:
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def pub(tmp_path):
    return write_keypair(tmp_path / "k")[1]


def _verify(srv, pub, **kw):
    host = f"127.0.0.1:{srv.server_address[1]}"
    return attest.verify_image(f"{host}/envbuild/verl@{DIGEST}", pub,
                               registry=Registry(host, timeout=5, deadline_s=kw.get("deadline", 10)))


def test_a_json_list_where_a_manifest_belongs(pub):
    srv = serve(att=b"[1, 2, 3]")
    try:
        with pytest.raises(VerifyError, match="no valid test-result attestation"):
            _verify(srv, pub)
    finally:
        srv.shutdown()


def test_twenty_thousand_layers(pub):
    layers = [{"mediaType": attest.DSSE_MEDIA_TYPE, "digest": "sha256:" + "0" * 64, "size": 1}] * 20000
    srv = serve(att=json.dumps({"schemaVersion": 2, "layers": layers}).encode())
    try:
        t0 = time.monotonic()
        with pytest.raises(VerifyError, match="20000 layers"):
            _verify(srv, pub)
        assert time.monotonic() - t0 < 10
    finally:
        srv.shutdown()


def test_a_huge_referrers_index(pub):
    srv = serve(referrers=b'{"manifests": [' + b'{"digest": "x"},' * 400_000 + b'{}]}')
    try:
        with pytest.raises(InfraError, match="larger than 4 MiB"):
            _verify(srv, pub)
    finally:
        srv.shutdown()


def test_a_dripping_body_ends_at_the_deadline(pub):
    srv = serve(drip=True)
    try:
        t0 = time.monotonic()
        with pytest.raises(InfraError, match="deadline"):
            _verify(srv, pub, deadline=3)
        assert time.monotonic() - t0 < 8
    finally:
        srv.shutdown()
