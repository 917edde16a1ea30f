"""Records signed by the job that made them: what keeps an unsigned file from becoming a signed row.

The nightly's publish folds records that other jobs wrote (the census in `plan`, each `build`, each
`probe` on a GPU runner) and that reach it as artifacts nothing signs: whoever can add or change a
file there once would get the CI key's signature on any row. So each job signs its own records
before they leave its runner (`envbuild ci sign-records`): one in-toto Statement whose subjects are
the record files it wrote (`records/<combo>/<run>.json`, by sha256) and whose predicate names the
job, the CI run and the combinations the job speaks for, in a DSSE envelope at
RESULTS/signatures/<job>.dsse.json. `publish --signed-records` then folds a record only where such a
statement covers it: signed by a key it trusts (its own, or `--record-pubkey`), of this run, with
the file's bytes unchanged and the record's combination one the job speaks for; every other record
is left out with a one-line reason, and is left out of the table's records archive too (the next
night takes only what the table vouched for).

A job signs only the records no envelope beside them lists yet: the probe job downloads the build's
records (and the build's envelope) and adds its own.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .archive import files_under
from .errors import InputError
from .fsutil import safe_name, write_atomic
from .record import MAX_RECORD_BYTES
from .sign import IN_TOTO_PAYLOAD_TYPE, STATEMENT_TYPE, PublicKey, VerifyError, sign_envelope, verify_envelope

SIGNATURES = "signatures"  # RESULTS/signatures/<job>.dsse.json
RECORDS_GLOB = "records/*/*.json"
PREDICATE_TYPE = "https://envbuild.invalid/record-set/v1"  # documented in builder/README.md
MAX_ENVELOPE_BYTES = 16 << 20


def envelope_path(results: str | os.PathLike, job: str) -> Path:
    return Path(results) / SIGNATURES / f"{safe_name(job, 'job', '--job')}.dsse.json"


def _envelopes(results: str | os.PathLike) -> list[Path]:
    d = Path(results) / SIGNATURES
    return sorted(p for p in d.glob("*.dsse.json") if p.is_file() and not p.is_symlink()) if d.is_dir() else []


def _statement(payload: bytes) -> dict | None:
    try:
        st = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    return st if isinstance(st, dict) else None


def _unverified_statement(env: object) -> dict | None:
    """The statement an envelope carries, read without verifying (which files are signed already)."""
    import base64

    try:
        return _statement(base64.b64decode(env["payload"], validate=True))  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return None


def _subjects(st: dict) -> dict[str, str]:
    out = {}
    for s in st.get("subject") if isinstance(st.get("subject"), list) else []:
        if isinstance(s, dict) and isinstance(s.get("name"), str) and isinstance(s.get("digest"), dict) \
                and isinstance(s["digest"].get("sha256"), str):
            out[s["name"]] = s["digest"]["sha256"]
    return out


def _read_envelope(p: Path) -> object:
    if p.stat().st_size > MAX_ENVELOPE_BYTES:
        raise ValueError(f"larger than {MAX_ENVELOPE_BYTES >> 20} MiB")
    return json.loads(p.read_text(encoding="utf-8"))


def listed(results: str | os.PathLike) -> set[str]:
    """Record files an envelope under RESULTS already lists (verified or not: publish judges them)."""
    out: set[str] = set()
    for p in _envelopes(results):
        try:
            st = _unverified_statement(_read_envelope(p))
        except (OSError, ValueError, RecursionError):
            continue
        if st:
            out |= set(_subjects(st))
    return out


def _combo_of(data: bytes) -> str | None:
    try:
        d = json.loads(data)
    except (ValueError, RecursionError):
        return None
    c = d.get("combo") if isinstance(d, dict) else None
    cid = c.get("id") if isinstance(c, dict) else None
    return cid if isinstance(cid, str) else None


def sign_records(results: str | os.PathLike, signer, *, job: str, run: str,
                 combos: list[str] | None = None) -> dict:
    """Sign the records under RESULTS that no envelope there lists yet, as job `job` of CI run
    `run`; `combos` (when given) are the only combinations it may sign for. Returns
    {"envelope": path or None, "records": [...], "combos": [...]}; writes nothing when there is
    nothing new."""
    dest = envelope_path(results, job)
    if dest.exists():
        raise InputError(str(dest), None, "--job", job, "this job's envelope is already there (a job name "
                                                         "signs once per run)")
    if not isinstance(run, str) or not run.strip():
        raise InputError("--run", None, "--run", run, "expected the CI run's id ($GITHUB_RUN_ID)")
    done = listed(results)
    subjects, seen = [], set()
    for rel in files_under(results, RECORDS_GLOB):
        if rel in done:
            continue
        p = Path(results) / rel
        if p.stat().st_size > MAX_RECORD_BYTES:
            raise InputError(str(p), None, "size", p.stat().st_size, "not a record (too large)")
        data = p.read_bytes()
        cid = _combo_of(data)
        if cid is None:
            raise InputError(str(p), None, "combo.id", None, "not a record: nothing to sign")
        if combos is not None and cid not in combos:
            raise InputError(str(p), None, "combo.id", cid,
                             f"this job speaks for {', '.join(combos) or 'no combination'} only")
        seen.add(cid)
        subjects.append({"name": rel, "digest": {"sha256": hashlib.sha256(data).hexdigest()}})
    if not subjects:
        return {"envelope": None, "records": [], "combos": []}
    speaks = sorted(combos if combos is not None else seen)
    st = {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": PREDICATE_TYPE,
          "predicate": {"job": job, "run": run, "combos": speaks}}
    env = sign_envelope(json.dumps(st, sort_keys=True, separators=(",", ":")).encode(), IN_TOTO_PAYLOAD_TYPE, signer)
    write_atomic(dest, json.dumps(env, indent=1) + "\n")
    return {"envelope": str(dest), "records": [s["name"] for s in subjects], "combos": speaks}


def add_arguments(p) -> None:
    """The flags of a command that folds records and signs what it folds (publish, attach)."""
    p.add_argument("--signed-records", action="store_true",
                   help="take only the records their jobs signed (RESULTS/signatures, `envbuild ci sign-records`) "
                        "with this key or a --record-pubkey, for --run; say why each other one is left out")
    p.add_argument("--record-pubkey", action="append", default=[], metavar="FILE",
                   help="another public key whose record signatures count (the jobs' record key); repeatable")
    p.add_argument("--run", default=os.environ.get("GITHUB_RUN_ID") or None, metavar="ID",
                   help="the CI run the record signatures must name (default: $GITHUB_RUN_ID; none: any run)")


def from_arguments(args, signer) -> tuple[set[str] | None, list[str]]:
    """With --signed-records: the record files their jobs' signatures cover (the command's own key,
    `signer`, counts too) and why the others are not; without it, (None, [])."""
    if not args.signed_records:
        return None, []
    from .sign import load_public_key, public_key_of

    keys = [public_key_of(signer)] + [load_public_key(f) for f in args.record_pubkey]
    return signed_records(args.results, keys, args.run)


def signed_records(results: str | os.PathLike, keys: list[PublicKey], run: str | None) -> tuple[set[str], list[str]]:
    """(the record files under RESULTS a trusted statement covers, one reason for each other one and
    for each envelope not taken). A statement is taken when one of `keys` signed it, it is a
    record-set statement and, where `run` is given, of that run; a record it lists counts when its
    bytes are the signed ones and its combination is one the statement speaks for."""
    covers: dict[str, list[tuple[str, set[str], str]]] = {}
    notes: list[str] = []
    for p in _envelopes(results):
        where = f"{SIGNATURES}/{p.name}"
        try:
            env = _read_envelope(p)
        except (OSError, ValueError, RecursionError) as e:
            notes.append(f"{where}: not a signature file ({str(e)[:120]})")
            continue
        payload = None
        for k in keys:
            try:
                payload, ptype = verify_envelope(env, k, where)
                break
            except VerifyError as e:
                why = str(e)
        if payload is None:
            notes.append(why if keys else f"{where}: no key to verify it with")
            continue
        st = _statement(payload)  # what the signature covers, not the envelope read again
        pred = st.get("predicate") if st else None
        if ptype != IN_TOTO_PAYLOAD_TYPE or not st or st.get("_type") != STATEMENT_TYPE \
                or st.get("predicateType") != PREDICATE_TYPE or not isinstance(pred, dict):
            notes.append(f"{where}: signed, but not a record-set statement")
            continue
        if run is not None and pred.get("run") != run:
            notes.append(f"{where}: signed for run {str(pred.get('run'))[:40]!r}, not this run ({run})")
            continue
        combos = pred.get("combos")
        combos = {c for c in combos if isinstance(c, str)} if isinstance(combos, list) else set()
        job = str(pred.get("job"))[:80]
        for name, sha in _subjects(st).items():
            covers.setdefault(name, []).append((sha, combos, job))
    accepted: set[str] = set()
    for rel in files_under(results, RECORDS_GLOB):
        entries = covers.get(rel)
        if not entries:
            notes.append(f"{rel}: no signed record set of this run lists it")
            continue
        p = Path(results) / rel
        data = p.read_bytes() if p.stat().st_size <= MAX_RECORD_BYTES else b""
        sha = hashlib.sha256(data).hexdigest()
        same = [e for e in entries if e[0] == sha]
        if not same:
            notes.append(f"{rel}: changed after job {entries[0][2]} signed it (sha256 differs)")
            continue
        cid = _combo_of(data)
        if not any(cid in e[1] for e in same):
            notes.append(f"{rel}: job {same[0][2]} signed it, but speaks for {', '.join(sorted(same[0][1]))[:200]}, "
                         f"not {str(cid)[:120]}")
            continue
        accepted.add(rel)
    return accepted, notes
