"""A hostile registry for the fuzz runs (issue 27): each try is a server on 127.0.0.1 that answers
the requests of `verify IMAGE@sha256:…` from a random plan: wrong shapes (lists, strings, numbers
where objects belong), wrong digests, bad statuses, huge or truncated bodies, and broken HTTP
framing (a bad status line, too many headers, a bad chunk size). The judge: every try ends within
its bound as a VerifyError (trust, exit 2), InfraError (exit 3) or InputError, never anything else.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import random
import threading
import time

IMAGE = b'{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","layers":[]}'
DIGEST = "sha256:" + hashlib.sha256(IMAGE).hexdigest()
DSSE = "application/vnd.dsse.envelope.v1+json"


def _shape(rnd: random.Random, depth: int = 0):
    k = rnd.randrange(8 if depth < 3 else 5)
    if k == 0:
        return rnd.choice([None, True, 0, -1, 10 ** 30, 1.5])
    if k == 1:
        return rnd.choice(["", "x", "sha256:" + "0" * 64, DSSE, "\u0000\ud7ff", "a" * 5000])
    if k == 2:
        return "sha256:" + "".join(rnd.choice("0123456789abcdef") for _ in range(64))
    if k in (3, 4):
        return rnd.choice([[], {}, "[]"])
    if k in (5, 6):
        return {rnd.choice(["layers", "manifests", "mediaType", "digest", "annotations", "subject", "payload",
                            "signatures", "payloadType", "predicateType", rnd.choice("abc")]): _shape(rnd, depth + 1)
                for _ in range(rnd.randrange(6))}
    return [_shape(rnd, depth + 1) for _ in range(rnd.randrange(5))]


def _manifest(rnd: random.Random) -> bytes:
    if rnd.random() < 0.3:
        return json.dumps(_shape(rnd)).encode()
    layers = [{"mediaType": rnd.choice([DSSE, "x", None]),
               "digest": rnd.choice(["sha256:" + "1" * 64, _shape(rnd), "../../etc/passwd"]),
               "annotations": rnd.choice([{"predicateType": "https://in-toto.io/attestation/test-result/v0.1"},
                                          _shape(rnd)])} for _ in range(rnd.choice([0, 1, 3, 300]))]
    return json.dumps({"schemaVersion": 2, "layers": layers,
                       "annotations": rnd.choice([{}, {"org.opencontainers.image.created": "2999"}, _shape(rnd)]),
                       "subject": rnd.choice([{"digest": DIGEST}, _shape(rnd)])}).encode()


def _body(rnd: random.Random, what: str) -> tuple[int, bytes]:
    r = rnd.random()
    if r < 0.15:
        return rnd.choice([404, 500, 302, 418]), b""
    if r < 0.25:
        return 200, bytes(rnd.randrange(256) for _ in range(rnd.randrange(200)))
    if what == "referrers":
        return 200, json.dumps(rnd.choice([{"manifests": [_shape(rnd) for _ in range(rnd.randrange(4))]},
                                           _shape(rnd)])).encode()
    if what == "blob":
        return 200, json.dumps({"payloadType": "application/vnd.in-toto+json", "payload": _shape(rnd),
                                "signatures": _shape(rnd)}).encode()
    return 200, _manifest(rnd)


class HostileRegistry:
    """One try's server. `framing`: a share of responses with broken HTTP framing."""

    def __init__(self, seed: str, framing: float = 0.15):
        self.rnd = random.Random(seed)
        rnd, lock = self.rnd, threading.Lock()

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_HEAD(self):
                self.do_GET(head=True)

            def do_GET(self, head=False):
                with lock:
                    roll = rnd.random()
                    if self.path.endswith(f"/manifests/{DIGEST}") and roll < 0.9:
                        code, body, extra = 200, IMAGE, {"Docker-Content-Digest": DIGEST}
                    else:
                        what = "referrers" if "/referrers/" in self.path else "blob" if "/blobs/" in self.path \
                            else "manifest"
                        code, body = _body(rnd, what)
                        extra = {}
                    broken = rnd.random() < framing and not head
                    kind = rnd.randrange(5)
                try:
                    if broken:
                        w = self.wfile.write
                        if kind == 0:
                            w(b"HTTP/1.1 OK-ish\r\n\r\n")
                        elif kind == 1:
                            w(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(150)) + b"\r\n")
                        elif kind == 2:
                            w(b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 100_000 + b"\r\n\r\n")
                        elif kind == 3:
                            w(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n")
                        else:
                            w(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + body[:10])
                        return
                    self.send_response(code)
                    self.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
                    self.send_header("Content-Length", str(len(body)))
                    for k, v in extra.items():
                        self.send_header(k, v)
                    self.end_headers()
                    if not head:
                        self.wfile.write(body)
                except OSError:
                    pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.host = f"127.0.0.1:{self.srv.server_address[1]}"

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def verify_against(seed: str, pubkey, deadline: float = 10.0) -> tuple[str, float]:
    """One try: ('verify'|'infra'|'input'|'ok'|'CRASH: <type>', seconds)."""
    from envbuild import attest
    from envbuild.errors import InfraError, InputError
    from envbuild.registry import Registry
    from envbuild.sign import VerifyError

    reg = HostileRegistry(seed)
    t0 = time.monotonic()
    try:
        attest.verify_image(f"{reg.host}/envbuild/verl@{DIGEST}", pubkey,
                            registry=Registry(reg.host, timeout=3, deadline_s=deadline), remember=False)
        out = "ok"
    except VerifyError:
        out = "verify"
    except InfraError:
        out = "infra"
    except InputError:
        out = "input"
    except Exception as e:  # noqa: BLE001 - what the fuzz run counts
        out = f"CRASH: {type(e).__name__}: {str(e)[:120]}"
    finally:
        reg.close()
    return out, time.monotonic() - t0
