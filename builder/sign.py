"""Ed25519 keys, DSSE envelopes and in-toto Statements (`envbuild keygen`).

Signing goes through securesystemslib (CryptoSigner + dsse.Envelope). Verification of an
envelope is done here directly with `cryptography` over the same DSSE pre-authentication
encoding: importing securesystemslib.signer pulls in its cloud signers (boto3 and friends,
about a second on a cold machine), which would blow `pick`'s 200 ms budget. The tests check
that both paths accept and reject exactly the same envelopes.

Files:
  private key  PEM (PKCS#8, unencrypted), mode 0600
  public key   JSON {"keyid", "keytype": "ed25519", "scheme": "ed25519", "keyval": {"public": hex}}
               - the securesystemslib key dict plus its keyid, which DSSE signatures name.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError, TrustError

IN_TOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
TEST_RESULT_PREDICATE = "https://in-toto.io/attestation/test-result/v0.1"

DEFAULT_KEY_DIR = "keys"
DEFAULT_KEY_NAME = "envbuild"


class VerifyError(TrustError):
    """A signature did not verify (tampered, unsigned, wrong key): a trust failure (exit 2,
    see errors.TrustError), never a verdict on a stack."""


@dataclass(frozen=True)
class PublicKey:
    keyid: str
    public_hex: str  # raw 32-byte Ed25519 public key, hex

    def to_dict(self) -> dict:
        return {"keyid": self.keyid, **_key_body(self.public_hex)}


def _key_body(public_hex: str) -> dict:
    return {"keytype": "ed25519", "scheme": "ed25519", "keyval": {"public": public_hex}}


def compute_keyid(public_hex: str) -> str:
    """securesystemslib's default keyid: sha256 of the canonical JSON of the key body.

    The body holds only ASCII keys and a hex string, for which canonical JSON is exactly
    sorted keys without whitespace (the tests compare with securesystemslib's value).
    """
    body = json.dumps(_key_body(public_hex), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


# ---------------------------------------------------------------- keys


def generate_keypair() -> tuple[bytes, PublicKey]:
    from securesystemslib.signer import CryptoSigner

    signer = CryptoSigner.generate_ed25519()
    pub = PublicKey(signer.public_key.keyid, signer.public_key.keyval["public"])
    return signer.private_bytes, pub


def write_keypair(out_dir: str | os.PathLike, name: str = DEFAULT_KEY_NAME,
                  force: bool = False) -> tuple[Path, Path, PublicKey]:
    out = Path(out_dir)
    priv_path, pub_path = out / f"{name}.key", out / f"{name}.pub.json"
    if priv_path.exists() and not force:
        # Overwriting a signing key silently would orphan every table signed with it.
        raise InputError(str(priv_path), None, "key", str(priv_path),
                         "exists; pass --force to replace it")
    from .fsutil import write_atomic  # here: tempfile's import is not needed to verify

    pem, pub = generate_keypair()
    ignore = out / ".gitignore"
    if not ignore.exists():
        # The key folder usually sits in the user's repository: one `git add .` from committing an
        # unencrypted signing key. Git skips what this lists; the public half stays addable.
        write_atomic(ignore, "# envbuild keygen: never commit a private key\n*.key\n")
    write_atomic(priv_path, pem, mode=0o600)
    write_atomic(pub_path, json.dumps(pub.to_dict(), indent=2) + "\n")
    return priv_path, pub_path, pub


def load_signer(path: str | os.PathLike):
    """A securesystemslib CryptoSigner from an unencrypted Ed25519 PEM file."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import CryptoSigner

    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise InputError(str(path), None, "key", str(path),
                         f"cannot read signing key ({e.strerror}); make one with `envbuild keygen`")
    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise InputError(str(path), None, "key", str(path), f"not an unencrypted PEM private key ({e})")
    if not isinstance(key, Ed25519PrivateKey):
        raise InputError(str(path), None, "key", type(key).__name__, "expected an Ed25519 key")
    return CryptoSigner(key)


def public_key_of(signer) -> PublicKey:
    return PublicKey(signer.public_key.keyid, signer.public_key.keyval["public"])


def parse_public_key(d: object, where: str = "public key") -> PublicKey:
    """Validate a public key dict; its stated keyid must be the one its body hashes to."""
    if not isinstance(d, dict):
        raise InputError(where, None, "key", type(d).__name__, "expected a JSON object")
    if d.get("keytype") != "ed25519" or d.get("scheme") != "ed25519":
        raise InputError(where, None, "keytype", d.get("keytype"), "only ed25519 keys are supported")
    pub = (d.get("keyval") or {}).get("public") if isinstance(d.get("keyval"), dict) else None
    try:
        if not isinstance(pub, str) or len(bytes.fromhex(pub)) != 32:
            raise ValueError
    except ValueError:
        raise InputError(where, None, "keyval.public", pub, "expected 64 hex digits")
    keyid = compute_keyid(pub)
    if d.get("keyid") not in (None, keyid):
        raise InputError(where, None, "keyid", d.get("keyid"),
                         f"does not match the key (its keyid is {keyid})")
    return PublicKey(keyid, pub)


def load_public_key(src: str | os.PathLike | dict | PublicKey) -> PublicKey:
    if isinstance(src, PublicKey):
        return src
    if isinstance(src, dict):
        return parse_public_key(src)
    try:
        data = Path(src).read_bytes()[:KEY_FILE_MAX]
    except OSError as e:
        raise InputError(str(src), None, "pubkey", str(src), f"cannot read ({e.strerror})")
    return parse_public_key_bytes(data, str(src))


KEY_FILE_MAX = 64 * 1024  # a public key file is a few hundred bytes


def parse_public_key_bytes(data: bytes, where: str) -> PublicKey:
    try:
        d = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise InputError(where, None, "pubkey", f"byte {e.start}", "not UTF-8 (not a public key file)")
    except json.JSONDecodeError as e:
        if b"PRIVATE KEY" in data:  # the signing key handed where the public one belongs
            raise InputError(where, None, "pubkey", where, "a private key: pass the public half "
                             "(keygen's envbuild.pub.json), and keep this file secret") from None
        raise InputError(where, e.lineno, "pubkey", where, f"not JSON ({e.msg})")
    return parse_public_key(d, where)


# ---------------------------------------------------------------- DSSE


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what the signature covers."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def sign_envelope(payload: bytes, payload_type: str, signer) -> dict:
    from securesystemslib.dsse import Envelope

    env = Envelope(payload=payload, payload_type=payload_type, signatures={})
    env.sign(signer)
    return env.to_dict()


def verify_envelope(env: object, key: PublicKey, where: str = "envelope") -> tuple[bytes, str]:
    """Return (payload, payloadType) if a signature by `key` verifies; else raise VerifyError.

    Like securesystemslib's Envelope.verify(threshold=1): only signatures whose keyid is the
    key's count.
    """
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if not isinstance(env, dict) or not isinstance(env.get("payload"), str) \
            or not isinstance(env.get("payloadType"), str):
        raise VerifyError(f"{where}: not a DSSE envelope (payload/payloadType missing)")
    sigs = env.get("signatures")
    if not isinstance(sigs, list) or not sigs:
        raise VerifyError(f"{where}: unsigned (no signatures)")
    try:
        payload = base64.b64decode(env["payload"], validate=True)
    except (binascii.Error, ValueError):
        raise VerifyError(f"{where}: payload is not valid base64")
    message = pae(env["payloadType"], payload)
    verifier = Ed25519PublicKey.from_public_bytes(bytes.fromhex(key.public_hex))
    ours = [s for s in sigs if isinstance(s, dict) and s.get("keyid") == key.keyid]
    if not ours:
        names = ", ".join(str(s.get("keyid"))[:16] for s in sigs if isinstance(s, dict))
        raise VerifyError(f"{where}: not signed by key {key.keyid[:16]}… (signed by: {names or 'nobody'})")
    for s in ours:
        try:
            verifier.verify(base64.b64decode(s.get("sig", ""), validate=True), message)
            return payload, env["payloadType"]
        except (InvalidSignature, binascii.Error, ValueError, TypeError):
            continue
    raise VerifyError(f"{where}: signature by key {key.keyid[:16]}… does not match the content (tampered?)")


# ---------------------------------------------------------------- in-toto


def statement(subject_name: str, sha256_hex: str, predicate_type: str, predicate: dict) -> dict:
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": subject_name, "digest": {"sha256": sha256_hex}}],
        "predicateType": predicate_type,
        "predicate": predicate,
    }


def sign_statement(stmt: dict, signer) -> dict:
    payload = json.dumps(stmt, sort_keys=True, separators=(",", ":")).encode()
    return sign_envelope(payload, IN_TOTO_PAYLOAD_TYPE, signer)


# ---------------------------------------------------------------- CLI: keygen
