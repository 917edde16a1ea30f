"""Keys and DSSE: our fast verifier must agree with securesystemslib on every case."""

import base64
import json
import os
import shutil
import stat
import subprocess

import pytest
from securesystemslib.dsse import Envelope
from securesystemslib.signer import CryptoSigner

from envbuild.errors import InputError
from envbuild.sign import (IN_TOTO_PAYLOAD_TYPE, PublicKey, VerifyError, compute_keyid, load_public_key,
                           load_signer, pae, public_key_of, sign_envelope, sign_statement, statement,
                           verify_envelope, write_keypair)


@pytest.fixture(scope="module")
def signer():
    return CryptoSigner.generate_ed25519()


@pytest.fixture(scope="module")
def other():
    return CryptoSigner.generate_ed25519()


def sslib_accepts(env: dict, signer) -> bool:
    from securesystemslib.signer import Key
    key = Key.from_dict(signer.public_key.keyid, signer.public_key.to_dict())
    try:
        Envelope.from_dict(env).verify([key], 1)
        return True
    except Exception:
        return False


def ours_accepts(env: dict, signer) -> bool:
    try:
        verify_envelope(env, public_key_of(signer))
        return True
    except VerifyError:
        return False


def test_keyid_matches_securesystemslib(signer):
    assert compute_keyid(signer.public_key.keyval["public"]) == signer.public_key.keyid


def test_pae_is_the_dsse_encoding():
    assert pae("t/x", b"hello") == b"DSSEv1 3 t/x 5 hello"


def test_sign_then_verify_roundtrip(signer):
    env = sign_envelope(b'{"a": 1}', "application/x-test", signer)
    assert verify_envelope(env, public_key_of(signer)) == (b'{"a": 1}', "application/x-test")
    assert sslib_accepts(env, signer)


def _flip(s: str, i: int) -> str:
    c = s[i]
    return s[:i] + ("A" if c != "A" else "B") + s[i + 1:]


def test_every_single_character_change_of_payload_or_signature_is_rejected_by_both(signer):
    env = sign_envelope(b'{"rows": [1, 2, 3], "x": "y"}', "application/x-test", signer)
    cases = []
    for field in ("payload",):
        for i in range(len(env[field]) - 2):  # base64 padding chars aside, each position
            cases.append({**env, field: _flip(env[field], i)})
    sig = env["signatures"][0]["sig"]
    for i in range(0, len(sig) - 2, 3):
        cases.append({**env, "signatures": [{**env["signatures"][0], "sig": _flip(sig, i)}]})
    cases.append({**env, "payloadType": "application/x-tesT"})
    for bad in cases:
        if bad == env:
            continue
        assert not ours_accepts(bad, signer), bad
        assert not sslib_accepts(bad, signer), bad


def test_wrong_key_and_unsigned_are_rejected(signer, other):
    env = sign_envelope(b"payload", "application/x-test", signer)
    assert not ours_accepts(env, other) and not sslib_accepts(env, other)
    with pytest.raises(VerifyError, match="not signed by key"):
        verify_envelope(env, public_key_of(other))
    with pytest.raises(VerifyError, match="unsigned"):
        verify_envelope({**env, "signatures": []}, public_key_of(signer))
    # A signature by another key relabelled with our keyid still fails.
    forged = sign_envelope(b"payload", "application/x-test", other)
    forged["signatures"][0]["keyid"] = signer.public_key.keyid
    assert not ours_accepts(forged, signer) and not sslib_accepts(forged, signer)
    with pytest.raises(VerifyError, match="not a DSSE envelope"):
        verify_envelope({"payload": "x"}, public_key_of(signer))


def test_keygen_writes_private_0600_and_public_with_keyid(tmp_path):
    priv, pub_path, pub = write_keypair(tmp_path / "k")
    assert stat.S_IMODE(os.stat(priv).st_mode) == 0o600
    # inside a git repository, the private half is ignored and the public half is not (issue 28)
    if shutil.which("git"):
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
        ign = subprocess.run(["git", "-C", str(tmp_path), "check-ignore", "-q", str(priv)])
        pub_ign = subprocess.run(["git", "-C", str(tmp_path), "check-ignore", "-q", str(pub_path)])
        assert ign.returncode == 0 and pub_ign.returncode == 1
    d = json.loads(pub_path.read_text())
    assert d["keyid"] == pub.keyid == compute_keyid(d["keyval"]["public"])
    assert load_public_key(pub_path) == pub
    s = load_signer(priv)
    assert public_key_of(s) == pub
    env = sign_envelope(b"x", "t", s)
    assert verify_envelope(env, load_public_key(pub_path))[0] == b"x"
    with pytest.raises(InputError, match="exists"):
        write_keypair(tmp_path / "k")
    _, _, pub2 = write_keypair(tmp_path / "k", force=True)
    assert pub2.keyid != pub.keyid


def test_keygen_cli(tmp_path, run_cli):
    p = run_cli("keygen", "--out", tmp_path / "keys")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "keys" / "envbuild.key").read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    again = run_cli("keygen", "--out", tmp_path / "keys")
    assert again.returncode == 2 and "exists" in again.stderr and "Traceback" not in again.stderr


def test_public_key_with_wrong_keyid_or_type_is_refused(signer, tmp_path):
    d = PublicKey(signer.public_key.keyid, signer.public_key.keyval["public"]).to_dict()
    with pytest.raises(InputError, match="keyid"):
        load_public_key({**d, "keyid": "0" * 64})
    with pytest.raises(InputError, match="ed25519"):
        load_public_key({**d, "keytype": "rsa"})
    with pytest.raises(InputError, match="hex"):
        load_public_key({**d, "keyval": {"public": "zz"}})
    bad = tmp_path / "k.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not JSON"):
        load_public_key(bad)


def test_non_ed25519_private_key_refused(tmp_path):
    rsa = CryptoSigner.generate_rsa()
    p = tmp_path / "rsa.pem"
    p.write_bytes(rsa.private_bytes)
    with pytest.raises(InputError, match="Ed25519"):
        load_signer(p)
    with pytest.raises(InputError, match="cannot read"):
        load_signer(tmp_path / "missing.key")


def test_statement_envelope_is_in_toto(signer):
    st = statement("repo", "ab" * 32, "https://example.invalid/p", {"result": "PASSED"})
    env = sign_statement(st, signer)
    assert env["payloadType"] == IN_TOTO_PAYLOAD_TYPE
    assert json.loads(base64.b64decode(env["payload"])) == st
    assert sslib_accepts(env, signer)


def test_keygen_says_what_it_made_as_json(tmp_path, run_cli):
    import json
    p = run_cli("keygen", "--out", tmp_path / "k", "--json")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    pub = json.loads((tmp_path / "k" / "envbuild.pub.json").read_text())
    assert got == {"private_key": str(tmp_path / "k" / "envbuild.key"), "public_key": str(tmp_path / "k" / "envbuild.pub.json"),
                   "keyid": pub["keyid"]}
