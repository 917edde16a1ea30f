"""`envbuild wheelhouse SELECTORS --out DIR`: exactly the files of a row's lock, for a node without
Docker or an index (a Slurm GPU node, the lent H200): every layer's pins, each file chosen by the
lock's own hashes among the index's files for the row's platform and Python, downloaded and checked
against its sha256. `envbuild venv` installs them there, offline (envbuild.materialize).

Layout (several rows share one folder; a file two rows pin is stored once):
  DIR/manifest.json            {"schema": 1, "rows": {row id: {"combo", "lock_hash", "era", "glibc",
                               "locks": [layer files], "files": [{"name", "version", "file", "sha256",
                               "size", "kind": wheel|sdist, "host": bool}], "torch_index"}}}
  DIR/locks/<row id>/<layer>.txt   the lock's layers as the image installs them
  DIR/files/<file name>            the wheels (and sdists a lock builds from source)

--host-packages FILE ({name: version}, e.g. a node's `pip list --format=json`) leaves out the files
of pins the node already has at that very version: they are listed with "host": true, and `envbuild
venv --host-packages` reuses the node's own (or refuses if it turns out not to have them).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from packaging.tags import Tag
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename

from .errors import InfraError, InputError
from .fsutil import write_atomic
from .index import Metadata, _open
from .index_config import redact
from .lockmodel import ordered_wheel_tags
from .lockfile import pins_of
from .materialize import host_matches
from .probe.vocab import engine_index

CHUNK = 1 << 20


def _priority(tags: list[Tag]) -> dict[Tag, int]:
    return {t: i for i, t in enumerate(tags)}


_SAFE_FILENAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+!\-]*$")


def safe_filename(name: object) -> bool:
    """A file name from the index that is one plain base name (it becomes a path under --out and the
    census cache): no folder, no `..`, no leading dot, no odd characters."""
    return isinstance(name, str) and len(name) <= 255 and bool(_SAFE_FILENAME.match(name)) and ".." not in name


def choose_file(files: list[dict], version: str, hashes: set[str], prio: dict[Tag, int]) -> dict | None:
    """The file of this pin for this platform: among the index's files whose sha256 the lock lists,
    the wheel with the most specific compatible tag; else the sdist (built on the node). A file whose
    name is not one plain base name (`../../x-1.0.tar.gz`) is never a candidate."""
    best, best_rank, sdist = None, None, None
    for f in files:
        if not isinstance(f, dict):
            continue
        sha = (f.get("hashes") or {}).get("sha256") if isinstance(f.get("hashes"), dict) else None
        if sha not in hashes:
            continue
        name = f.get("filename", "")
        if not safe_filename(name):
            continue
        if name.endswith(".whl"):
            try:
                tags = parse_wheel_filename(name)[3]
            except Exception:  # noqa: BLE001 - a foreign file name is not a candidate
                continue
            ranks = [prio[t] for t in tags if t in prio]
            if ranks and (best_rank is None or min(ranks) < best_rank):
                best, best_rank = f, min(ranks)
        else:
            try:
                parse_sdist_filename(name)
            except Exception:  # noqa: BLE001
                continue
            sdist = f
    return best or sdist


def download(f: dict, dest: Path) -> int:
    """Stream one file to dest, checking its sha256; -> bytes. A file already there with the
    right hash is kept (a second row pinning it costs nothing)."""
    want = f["hashes"]["sha256"]
    if dest.is_file() and _sha256(dest) == want:
        return dest.stat().st_size
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part")
    h = hashlib.sha256()
    try:
        with _open(f["url"], timeout=120) as r, open(tmp, "wb") as out:
            while True:
                b = r.read(CHUNK)
                if not b:
                    break
                h.update(b)
                out.write(b)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise InfraError("index-unreachable", f"{redact(f['url'])}: {e}") from None
    if h.hexdigest() != want:
        tmp.unlink(missing_ok=True)
        raise InfraError("download-failure", f"{f['filename']}: sha256 {h.hexdigest()} is not the lock's {want}")
    os.replace(tmp, dest)
    return dest.stat().st_size


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(CHUNK), b""):
            h.update(b)
    return h.hexdigest()


def host_packages(path: str | None) -> dict[str, str]:
    """{canonical name: version} from a JSON file: a mapping, or pip list --format=json's list."""
    if not path:
        return {}
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise InputError(str(path), None, "--host-packages", str(path), f"unreadable ({e})") from None
    items = doc.items() if isinstance(doc, dict) else ((d.get("name"), d.get("version")) for d in doc
                                                        if isinstance(d, dict)) if isinstance(doc, list) else ()
    return {canonicalize_name(str(n)): str(v) for n, v in items if n and v}


# ---------------------------------------------------------------- CLI


def add_row(out: Path, doc: dict, c, layers: dict[str, str], meta: Metadata, host: dict[str, str], *,
            lock_hash: str | None, era: str, torch_index: str | None = None, beat=None,
            full_lock: str | None = None) -> tuple[list, int, int]:
    """Write one row's locks and files into the wheelhouse and its entry into `doc` (the manifest).
    -> (its files, bytes downloaded, files left to the node)."""
    prio = _priority(ordered_wheel_tags(c.python, c.glibc, c.platform))
    files, got, skipped, lock_files = [], 0, 0, []
    own = engine_index(c.engine)
    engine_meta = Metadata(index=own) if own else None  # where the lock found the engine's wheels
    for name_, text in layers.items():
        rel = f"locks/{c.id}/{name_}.txt"
        write_atomic(out / rel, text)
        lock_files.append(rel)
        for name, (version, hashes) in sorted(pins_of(text).items()):
            index_meta = Metadata(index=torch_index) if (name == "torch" and torch_index) else meta
            f = choose_file(index_meta.files(name), version, hashes, prio)
            if f is None and engine_meta is not None:
                f = choose_file(engine_meta.files(name), version, hashes, prio)
            if f is None:
                raise InfraError("missing-wheel", f"{c.id}: no file of {name}=={version} on the index has a "
                                                  "hash the lock lists and fits the row's platform")
            entry = {"name": name, "version": version, "file": f"files/{f['filename']}",
                     "sha256": f["hashes"]["sha256"], "size": f.get("size"),
                     "kind": "wheel" if f["filename"].endswith(".whl") else "sdist",
                     "host": host_matches(version, host.get(name), c.cuda)}
            if entry["host"]:
                skipped += 1
            else:
                entry["size"] = download(f, out / entry["file"])
                got += entry["size"]
            files.append(entry)
            if beat is not None:
                if not beat.stage.endswith("files"):
                    beat.stage_to(f"wheelhouse {c.id}: files")
                beat.advance(1, f"{f['filename']}, {got >> 20} MiB so far")
    doc["rows"][c.id] = {"combo": c.to_dict(), "lock_hash": lock_hash, "era": era, "glibc": c.glibc,
                         "locks": lock_files, "files": files,
                         "torch_index": redact(torch_index) if torch_index else "default"}
    if full_lock is not None:  # the lock whose sha256 is lock_hash: `venv` checks the layers against it
        rel = f"locks/{c.id}/full.txt"
        write_atomic(out / rel, full_lock)
        doc["rows"][c.id]["full_lock"] = rel
    return files, got, skipped


def platform_machine_of(c) -> str:
    from .probe.hardware import platform_machine

    return platform_machine(c.platform)
