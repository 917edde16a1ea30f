"""Remote tables on 127.0.0.1: https only (own CA), no downgrade, a size cap and one deadline."""

import datetime
import functools
import http.server
import ipaddress
import os
import ssl
import threading
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from table_fixtures import combo, image, passed, rec, write_all

from envbuild.errors import InfraError, TrustError
from envbuild.sign import write_keypair
from envbuild.table import publish
from envbuild.trust import load_verified

A = combo()


def _cert(tmp):
    """A CA and a leaf for 127.0.0.1 signed by it; returns (ca.pem, leaf.pem, leaf.key)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "envbuild test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(leaf_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = tmp / "ca.pem", tmp / "leaf.pem", tmp / "leaf.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
    return paths


class Handler(http.server.SimpleHTTPRequestHandler):
    """Files from `directory`, plus hostile paths: /slow/… trickles, /huge/… never ends,
    /to-http/… redirects to plain http, /to-https/… to https."""

    other = None  # {"http": base URL, "https": base URL}

    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path.startswith("/slow/"):
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            try:
                for _ in range(120):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(1)
            except OSError:
                pass
            return
        if self.path.startswith("/huge/"):
            self.send_response(200)
            if "with-length" in self.path:
                self.send_header("Content-Length", str(1 << 40))
            self.end_headers()
            try:
                block = b"x" * (1 << 16)
                for _ in range(1 << 14):  # up to 1 GiB, stops when the client hangs up
                    self.wfile.write(block)
            except OSError:
                pass
            return
        for prefix, scheme in (("/to-http/", "http"), ("/to-https/", "https")):
            if self.path.startswith(prefix):
                self.send_response(302)
                self.send_header("Location", self.other[scheme] + self.path[len(prefix):])
                self.end_headers()
                return
        super().do_GET()


def _serve(directory, tls=None):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=directory))
    srv.daemon_threads = True
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(tls[1], tls[2])
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def remote(tmp_path):
    res = tmp_path / "results"
    write_all(res, [rec(A, passed("env", "contract"), img=image(A), run=1)])
    priv, pub, _ = write_keypair(tmp_path / "keys")
    publish(res, priv, tmp_path / "site" / "table")
    tls = _cert(tmp_path)
    https, plain = _serve(str(tmp_path / "site"), tls), _serve(str(tmp_path / "site"))
    base = {"https": f"https://127.0.0.1:{https.server_address[1]}/", "http": f"http://127.0.0.1:{plain.server_address[1]}/"}
    Handler.other = base
    yield {**base, "ca": str(tls[0]), "pub": pub, "priv": priv, "res": res, "tmp": tmp_path}
    for s in (https, plain):
        s.shutdown()
        s.server_close()


def _config(tmp_path, text):
    cfg = os.environ["ENVBUILD_CONFIG"]  # the per-test folder (conftest)
    os.makedirs(cfg, exist_ok=True)
    with open(os.path.join(cfg, "config.toml"), "w") as f:
        f.write(text)


def test_https_with_our_ca_verifies(remote, run_cli):
    url = remote["https"] + "table/"
    t, info = load_verified(url, remote["pub"], ca=remote["ca"])
    assert info["verified"] and t.rows[0].id == A["id"]
    assert load_verified(url + "compat.json.dsse", remote["pub"], ca=remote["ca"])[0].rows == t.rows
    with pytest.raises(TrustError, match="certificate not trusted"):
        load_verified(url, remote["pub"])  # no CA given: the self-signed chain is not trusted
    p = run_cli("pick", "--vllm", "0.8.4", "--table", url, "--pubkey", remote["pub"],
                env={"SSL_CERT_FILE": remote["ca"]})
    assert p.returncode == 0 and p.stdout.strip() == image(A)["digest"], p.stderr
    p = run_cli("verify", url, "--pubkey", remote["pub"], "--ca", remote["ca"])
    assert p.returncode == 0 and "5 listed files match" in p.stdout, p.stderr


def test_plain_http_is_refused_unless_insecure(remote, run_cli):
    url = remote["http"] + "table/"
    with pytest.raises(TrustError, match="plain http"):
        load_verified(url, remote["pub"])
    p = run_cli("pick", "--vllm", "0.8.4", "--table", url, "--pubkey", remote["pub"])
    assert p.returncode == 2 and "plain http" in p.stderr and p.stderr.count("\n") == 1
    assert load_verified(url, insecure=True)[0].rows[0].id == A["id"]


def test_redirect_to_http_is_refused_and_to_https_followed(remote):
    with pytest.raises(TrustError, match="away from https"):
        load_verified(remote["https"] + "to-http/table/", remote["pub"], ca=remote["ca"])
    t, _ = load_verified(remote["https"] + "to-https/table/", remote["pub"], ca=remote["ca"])
    assert t.rows[0].id == A["id"]


def test_a_server_sending_a_byte_a_second_ends_within_the_deadline(remote, tmp_path):
    _config(tmp_path, "fetch_deadline_s = 2\n")
    t0 = time.monotonic()
    with pytest.raises(InfraError, match="within 2 s"):
        load_verified(remote["https"] + "slow/compat.json.dsse", remote["pub"], ca=remote["ca"])
    assert time.monotonic() - t0 < 3.5


@pytest.mark.parametrize("path", ["huge/compat.json.dsse", "huge/with-length/compat.json.dsse"])
def test_a_huge_response_is_cut_at_the_cap(remote, tmp_path, path):
    _config(tmp_path, "max_table_mib = 1\nfetch_deadline_s = 20\n")
    t0 = time.monotonic()
    with pytest.raises(InfraError, match="cap"):
        load_verified(remote["https"] + path, remote["pub"], ca=remote["ca"])
    assert time.monotonic() - t0 < 10


def test_remote_first_use_then_a_changed_key_is_refused(remote, tmp_path):
    url = remote["https"] + "table/"
    _, info = load_verified(url, ca=remote["ca"])
    assert info["key"] == "trusted on first use"
    evil, _, _ = write_keypair(tmp_path / "evil")
    publish(remote["res"], evil, tmp_path / "site" / "table")  # the server now serves another key's table
    with pytest.raises(TrustError, match="changed"):
        load_verified(url, ca=remote["ca"])


def test_remote_tampering_is_refused(remote, tmp_path):
    path = tmp_path / "site" / "table" / "compat.json"
    path.write_bytes(path.read_bytes().replace(b'"verified"', b'"broken"', 1))
    with pytest.raises(TrustError):
        load_verified(remote["https"] + "table/", remote["pub"], ca=remote["ca"])


def test_unreachable_url_is_infrastructure(remote):
    with pytest.raises(InfraError):
        load_verified("https://127.0.0.1:9/table/", remote["pub"])


@pytest.mark.parametrize("raw", [
    b"HTTP/1.1 OK-ish\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(150)) + b"\r\n",
    b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 100_000 + b"\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n{\"payload\": \"",
], ids=["bad-status-line", "150-headers", "100kB-header", "bad-chunk-size", "truncated"])
def test_malformed_http_from_a_table_server_is_infrastructure(raw, run_cli):
    """Issue 27: http.client's exceptions escaped as tracebacks, and a truncated body was called
    'not a DSSE envelope' (a trust failure, exit 2) instead of infrastructure (exit 3)."""
    import socket
    import threading
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            try:
                c.recv(65536)
                c.sendall(raw)
            except OSError:
                pass
            finally:
                c.close()
    threading.Thread(target=serve, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.getsockname()[1]}/table/"
        p = run_cli("pick", "--table", url, "--insecure", "--vllm", "0.8.4", timeout=60)
        assert p.returncode == 3 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    finally:
        srv.close()
