"""Verify a signed table (`envbuild verify`) and load one for other commands (`load_table`).

A table location is a directory (or URL ending in '/') holding compat.json + compat.json.dsse,
the compat.json file itself, or the .dsse envelope. The envelope's payload is the table; when
compat.json is present next to it, it must be byte-identical to the signed payload, so a one-byte
edit of either file is rejected.

Which key: --pubkey (or $ENVBUILD_PUBKEY) pins one. Without it, a local table is checked
against the pubkey.json published next to it - that catches corruption and edits, not a
forger who replaces both, so a note says so. A remote table needs a pinned key: trusting a key
fetched from the same server as the table would prove nothing.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .errors import InfraError, InputError
from .sign import PublicKey, VerifyError, load_public_key, parse_public_key, verify_envelope

TABLE_NAME = "compat.json"
ENVELOPE_SUFFIX = ".dsse"
PUBKEY_NAME = "pubkey.json"
DEFAULT_TABLE = "table"
FETCH_TIMEOUT_S = 20


def _is_url(s: str) -> bool:
    return s.startswith(("http://", "https://"))


def _normalize(src) -> str:
    src = str(src)
    if src.startswith("file://"):
        from urllib.parse import unquote, urlparse
        src = unquote(urlparse(src).path)
    return src


def _locate(src: str) -> tuple[str, str | None, str]:
    """(envelope location, table location or None, directory location) for a table argument."""
    url = _is_url(src)
    if src.endswith(ENVELOPE_SUFFIX):
        base = src[: -len(ENVELOPE_SUFFIX)]
        directory = base.rsplit("/", 1)[0] + "/" if url else str(Path(base).parent)
        return src, base, directory
    if url:
        if src.endswith(".json"):
            return src + ENVELOPE_SUFFIX, src, src.rsplit("/", 1)[0] + "/"
        d = src if src.endswith("/") else src + "/"
        return d + TABLE_NAME + ENVELOPE_SUFFIX, d + TABLE_NAME, d
    p = Path(src)
    if p.is_dir():
        return str(p / (TABLE_NAME + ENVELOPE_SUFFIX)), str(p / TABLE_NAME), str(p)
    return src + ENVELOPE_SUFFIX, src, str(p.parent)


def _fetch(loc: str, missing_ok: bool = False) -> bytes | None:
    if _is_url(loc):
        import urllib.error  # here: urllib.request costs ~25 ms to import, local tables never need it
        import urllib.request

        try:
            with urllib.request.urlopen(loc, timeout=FETCH_TIMEOUT_S) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            if e.code == 404 and missing_ok:
                return None
            if e.code == 404:
                raise VerifyError(f"{loc}: not found (HTTP 404)")
            raise InfraError("table-unreachable", f"{loc}: HTTP {e.code}")
        except (urllib.error.URLError, OSError) as e:
            raise InfraError("table-unreachable", f"{loc}: {getattr(e, 'reason', e)}")
    try:
        return Path(loc).read_bytes()
    except FileNotFoundError:
        if missing_ok:
            return None
        raise
    except OSError as e:
        raise InputError(loc, None, "table", loc, f"cannot read ({e.strerror})")


def _join(directory: str, name: str) -> str:
    return directory + name if _is_url(directory) else str(Path(directory) / name)


def _resolve_key(pubkey, directory: str, quiet: bool) -> PublicKey:
    pubkey = pubkey or os.environ.get("ENVBUILD_PUBKEY") or None
    if pubkey is not None:
        return load_public_key(pubkey)
    if _is_url(directory):
        raise VerifyError("a remote table needs a pinned key: pass --pubkey KEY (or set $ENVBUILD_PUBKEY), "
                          "or --insecure to skip verification")
    loc = _join(directory, PUBKEY_NAME)
    data = _fetch(loc, missing_ok=True)
    if data is None:
        raise VerifyError(f"no --pubkey given and no {loc} next to the table")
    try:
        key = parse_public_key(json.loads(data), loc)
    except json.JSONDecodeError as e:
        raise InputError(loc, e.lineno, "pubkey", loc, f"not JSON ({e.msg})")
    if not quiet:
        print(f"note: checked against the key published next to the table ({loc}, keyid {key.keyid[:16]}…); "
              "pass --pubkey to pin the key you trust", file=sys.stderr)
    return key


def load_verified(src: str | os.PathLike, pubkey=None, insecure: bool = False,
                  quiet: bool = False) -> tuple[dict, dict]:
    """(table, info) after verification; info says what was checked (keyid, files)."""
    from .table import SCHEMA, TABLE_PAYLOAD_TYPE

    src = _normalize(src)
    env_loc, table_loc, directory = _locate(src)
    info = {"source": src, "envelope": env_loc, "keyid": None, "verified": False}
    if insecure:
        # Skip the signature, not the parsing: prefer the plain table, else the envelope payload.
        data = _fetch(table_loc, missing_ok=True) if table_loc else None
        if data is None:
            raw = _fetch(env_loc, missing_ok=True)
            if raw is None:
                raise InputError(src, None, "table", src, "no compat.json or compat.json.dsse there")
            import base64
            data = base64.b64decode(json.loads(raw).get("payload", ""))
        return _parse_table(data, table_loc or env_loc, SCHEMA), info

    raw = _fetch(env_loc, missing_ok=True)
    if raw is None:
        if table_loc and _fetch(table_loc, missing_ok=True) is not None:
            raise VerifyError(f"{table_loc}: unsigned (no {Path(env_loc).name} next to it)")
        raise InputError(src, None, "table", src, "no signed table (compat.json.dsse) there")
    try:
        env = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise VerifyError(f"{env_loc}: not a DSSE envelope (not JSON)")
    key = _resolve_key(pubkey, directory, quiet)
    payload, ptype = verify_envelope(env, key, env_loc)
    if ptype != TABLE_PAYLOAD_TYPE:
        raise VerifyError(f"{env_loc}: payloadType {ptype!r} is not an envbuild table")
    if table_loc:
        plain = _fetch(table_loc, missing_ok=True)
        if plain is not None and plain != payload:
            raise VerifyError(f"{table_loc}: differs from the signed payload in {Path(env_loc).name} (tampered?)")
    info.update(keyid=key.keyid, verified=True)
    return _parse_table(payload, env_loc, SCHEMA), info


def _parse_table(data: bytes, where: str, schema: int) -> dict:
    try:
        table = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(where, None, "table", where, f"not JSON ({e})")
    if not isinstance(table, dict) or not isinstance(table.get("rows"), list):
        raise InputError(where, None, "rows", None, "not an envbuild table")
    if table.get("schema") != schema:
        raise InputError(where, None, "schema", table.get("schema"),
                         f"this envbuild reads schema {schema}; upgrade envbuild")
    return table


def load_table(path_or_url: str | os.PathLike, pubkey=None, insecure: bool = False) -> dict:
    """Verify, then return the table (for pick, doctor, diff). Raises VerifyError (exit 1)."""
    return load_verified(path_or_url, pubkey, insecure)[0]


# ---------------------------------------------------------------- CLI


def add_arguments(p) -> None:
    p.add_argument("table", nargs="?", default=DEFAULT_TABLE,
                   help=f"table directory, compat.json, its .dsse envelope, or a URL (default: {DEFAULT_TABLE})")
    p.add_argument("--pubkey", help="public key JSON to verify against (default: $ENVBUILD_PUBKEY, "
                                    "else pubkey.json next to a local table)")
    p.add_argument("--attestations", action="store_true",
                   help="also verify every image's in-toto attestation in attestations/")


def run(args) -> int:
    if args.table and "@sha256:" in str(args.table):  # an image by digest: its attached attestations
        from .attach import verify_cli

        return verify_cli(args.table, args.pubkey)
    table, info = load_verified(args.table, args.pubkey)
    print(f"OK: {info['envelope']} signed by keyid {info['keyid']} "
          f"({len(table['rows'])} rows, generated {table.get('generated')})")
    if args.attestations:
        n = verify_attestations(args.table, table, args.pubkey)
        print(f"OK: {n} image attestations")
    return 0


def verify_attestations(src: str, table: dict, pubkey=None) -> int:
    """Each row with a digest has a signed Statement whose subject is that digest."""
    from .sign import IN_TOTO_PAYLOAD_TYPE, STATEMENT_TYPE

    _, _, directory = _locate(_normalize(src))
    key = _resolve_key(pubkey, directory, quiet=True)
    n = 0
    for row in table["rows"]:
        digest = (row.get("image") or {}).get("digest")
        if not digest:
            continue
        loc = _join(directory, f"attestations/{row['id']}.dsse.json")
        raw = _fetch(loc, missing_ok=True)
        if raw is None:
            raise VerifyError(f"{loc}: missing attestation for {row['id']}")
        payload, ptype = verify_envelope(json.loads(raw), key, loc)
        stmt = json.loads(payload)
        subj = [s.get("digest", {}).get("sha256") for s in stmt.get("subject", [])]
        if ptype != IN_TOTO_PAYLOAD_TYPE or stmt.get("_type") != STATEMENT_TYPE or digest != f"sha256:{subj[0] if subj else ''}":
            raise VerifyError(f"{loc}: statement does not name image {digest}")
        n += 1
    return n

